"""Where a (non-elastic) job's ranks go: the first source in SOURCES that applies decides.

    -H host1:2,host2:2     ExplicitHosts   the ranks reach the hosts over ssh
    --hostfile FILE        Hostfile        the same, hosts read from the file
    HYDRA_HOST_FILE=FILE   OperatorHostfile (operator_hostfile.py) the file a job controller names, as
                                           in an MPIJob's launcher pod; -np defaults to its slots
    inside sbatch/salloc   SlurmAllocation (slurm_allocation.py) the allocation's nodes and task
                                           counts; the ranks start through Slurm (srun), not ssh
    otherwise              ThisMachine     every rank here, forked

A source gives a Placement: the hosts (None: this machine only), the number of ranks (-np, or
what the source itself knows, e.g. the allocation's task count), how the launcher reaches the
hosts (its bootstrap), and how collectivesrun probes a host after a failure (a supervise.Reach).
A new way of finding hosts is one class with ``applies`` and ``place`` and a line in SOURCES.
"""
from dataclasses import dataclass
from typing import List, Optional

from . import hosts as hostspec
from . import operator_hostfile, slurm_allocation, supervise

FORK = "fork"  # hydra forks every proxy here
SSH = "ssh"  # hydra's default launcher
SLURM = "slurm"  # hydra's -launcher slurm: its proxies start as one srun step


class PlacementError(Exception):
    """No placement can be made from the command line and environment; one line for the user."""


@dataclass
class Placement:
    hosts: Optional[List[hostspec.Host]]  # None: every rank on this machine
    np: int
    bootstrap: str  # FORK, SSH or SLURM
    reach: supervise.Reach  # how a host is probed (and swept) after a failure
    check_ssh: bool  # check every host resolves and answers ssh before starting
    source: str  # for messages: "-H", "--hostfile", "the Slurm allocation", "this machine"
    threads_per_rank: Optional[int] = None  # OMP_NUM_THREADS for ranks on other machines, when known


def _need_np(args, where):
    if args.np is None:
        raise PlacementError(f"-np N is required with {where}")
    return args.np


class ExplicitHosts:
    def applies(self, args, environ):
        return bool(args.hosts)

    def place(self, args, environ):
        hosts = hostspec.parse_host_list(args.hosts)
        return Placement(hosts, _need_np(args, "-H"), SSH, supervise.SSH_REACH, True, "-H")


class Hostfile:
    def applies(self, args, environ):
        return bool(args.hostfile)

    def place(self, args, environ):
        hosts = hostspec.parse_hostfile(args.hostfile)
        return Placement(hosts, _need_np(args, "--hostfile"), SSH, supervise.SSH_REACH, True, "--hostfile")


class OperatorHostfile:
    def applies(self, args, environ):
        return operator_hostfile.find(environ) is not None

    def place(self, args, environ):
        found = operator_hostfile.find(environ)
        try:
            hosts = hostspec.parse_hostfile(found.path)
        except hostspec.HostSpecError as e:
            raise hostspec.HostSpecError(f"{e} (the host file named by {found.variable})") from None
        np_ = args.np if args.np is not None else sum(h.slots for h in hosts)
        return Placement(hosts, np_, SSH, supervise.SSH_REACH, True, f"the host file {found.describe()}")


class SlurmAllocation:
    def applies(self, args, environ):
        return slurm_allocation.inside(environ)

    def place(self, args, environ):
        try:
            alloc = slurm_allocation.read(environ)
        except slurm_allocation.SlurmAllocationError as e:
            raise PlacementError(str(e)) from None
        np_ = args.np if args.np is not None else alloc.tasks
        return Placement(alloc.hosts, np_, SLURM, slurm_allocation.SlurmdReach(environ), False,
                         f"the Slurm allocation (job {alloc.job_id})",
                         slurm_allocation.threads_per_rank(environ, alloc, np_))


class ThisMachine:
    def applies(self, args, environ):
        return True

    def place(self, args, environ):
        if args.np is None:
            raise PlacementError("-np N is required: not inside a Slurm allocation (SLURM_JOB_ID is not set) and "
                                 "no -H/--hostfile (nor HYDRA_HOST_FILE, as in an MPIJob's launcher pod); give -np N, "
                                 "or run inside sbatch/salloc to use the allocation")
        return Placement(None, args.np, FORK, supervise.SSH_REACH, False, "this machine")


SOURCES = [ExplicitHosts(), Hostfile(), OperatorHostfile(), SlurmAllocation(), ThisMachine()]


def place(args, environ) -> Placement:
    """The first applicable source's Placement; PlacementError or hosts.HostSpecError."""
    source = next(s for s in SOURCES if s.applies(args, environ))
    return source.place(args, environ)
