"""``collectivesrun`` (also ``python -m collectives.run``): the command line: start N ranks of a training script
with the MPI launcher the engine was built with.

    collectivesrun -np 4 [-H host1:2,host2:2 | --hostfile FILE] [--fusion-threshold-mb N]
                   [--cycle-time-ms N] [--timeline-filename F] [--stall-check-time S]
                   [-x VAR=VALUE | -x VAR]... python train.py ...
    collectivesrun python train.py          # inside sbatch/salloc: the allocation's nodes and tasks
    collectivesrun --check-build

Where the ranks go is decided by the first applicable source in host_sources.py (-H, --hostfile,
a Slurm allocation, this machine).

It checks everything it can before starting anything (the launcher exists and runs, every host
resolves and remote ones answer ssh, knob values parse), so a bad setup ends with one line
saying what is wrong and a non-zero exit instead of a hang. Then it runs the launcher as its
child and watches the job (supervise.py): output passes through unchanged, signals are
forwarded, and a normal job's exit status is the job's own; a job that a crashed host or a
cut link has broken is ended, with one line naming the hosts and ranks. Plain
``mpirun -np N python train.py`` keeps working: nothing here is required at run time.
"""
import dataclasses
import os
import shlex
import shutil
import socket
import sys
import uuid
from typing import Dict, List, NamedTuple

from .. import __version__
from . import args as cli
from . import (check_build, command, environment, host_sources, hosts as hostspec, mpi_locator, operator_hostfile,
               reachability, supervise)

PROG = "collectivesrun"


class LaunchError(Exception):
    """Anything that stops the launch; printed as one line."""


def _warn(message):
    print(f"{PROG}: warning: {message}", file=sys.stderr)


def usable_cores():
    try:
        return len(os.sched_getaffinity(0))  # the cores this process (and so its ranks) may use
    except AttributeError:
        return os.cpu_count() or 1


def interpreter_for(program):
    """A bare ``python``/``python3``/``python3.X`` means this interpreter, the one that has
    collectives and its engine installed, unless PATH already finds this very one: it keeps
    ``.venv/bin/collectivesrun ... python train.py`` working without activating the venv."""
    names = {"python", "python3", f"python{sys.version_info.major}.{sys.version_info.minor}"}
    if program not in names:
        return program
    found = shutil.which(program)
    if found and os.path.dirname(os.path.abspath(found)) == os.path.dirname(os.path.abspath(sys.executable)):
        return program
    return sys.executable


class Launch(NamedTuple):
    """What plan() decided: the launcher, its argv and environment, and where the ranks go."""
    path: str
    argv: List[str]
    env: Dict[str, str]
    hosts: List[supervise.HostRanks]
    reach: supervise.Reach  # how hosts are probed after a failure


def _placement(args, environ, timeout):
    """(the host_sources.Placement, every host is this machine, ranks on this machine or None,
    the ranks of each host)."""
    where = host_sources.place(args, environ)
    if where.hosts is None:
        return where, True, where.np, [supervise.HostRanks(socket.gethostname(), tuple(range(where.np)), True)]
    hosts = where.hosts
    if where.check_ssh:
        statuses = reachability.check_hosts([h.name for h in hosts], timeout)
        local_of = {name: status.local for name, status in statuses.items()}
        all_local = all(local_of[h.name] for h in hosts)
        if not all_local:
            for h in hosts:
                if statuses[h.name].loopback_only:
                    # Ranks on the other hosts would try to reach this one at their own loopback.
                    raise hostspec.HostSpecError(f"host '{h.name}' is a loopback name; with other hosts in the "
                                                 "job, name this machine by its network name or address")
    else:
        # Started through the hosts' own manager (Slurm): no host counts as forked here.
        local_of = {h.name: False for h in hosts}
        all_local = False
    counts = hostspec.ranks_per_host(where.np, hosts)
    slots = sum(h.slots for h in hosts)
    if where.np > slots:
        _warn(f"{where.np} ranks on {slots} slots of {where.source}: hosts take more ranks than their slots")
    local = sum(n for h, n in zip(hosts, counts) if local_of[h.name])
    placed: Dict[str, supervise.HostRanks] = {}
    for h, ranks in zip(hosts, hostspec.ranks_on_hosts(where.np, hosts)):  # a host may be listed twice
        before = placed.get(h.name)
        placed[h.name] = supervise.HostRanks(h.name, (before.ranks if before else ()) + tuple(ranks), local_of[h.name])
    return where, all_local, local or None, [p for p in placed.values() if p.ranks]


def plan(args, environ):
    """A Launch, or LaunchError."""
    try:
        launcher = mpi_locator.locate(environ)
    except mpi_locator.LauncherError as e:
        raise LaunchError(str(e)) from None
    for w in launcher.warnings:
        _warn(w)
    try:
        where, all_local, local_ranks, placed = _placement(args, environ, args.start_timeout)
        # In an MPIJob's launcher pod, the lines about lost hosts name the pod too.
        placed = [dataclasses.replace(p, pod=operator_hostfile.pod_of(p.name, environ)) for p in placed]
    except (hostspec.HostSpecError, reachability.UnreachableHostError, host_sources.PlacementError) as e:
        raise LaunchError(str(e)) from None
    if not all_local and launcher.flavor == mpi_locator.UNKNOWN:
        raise LaunchError(f"{launcher.path} is not MPICH/hydra or Open MPI; collectivesrun can only "
                          "launch it on this machine (run it directly for other hosts)")
    try:
        rank_env = environment.build(args, environ, local_ranks, usable_cores(), launcher.flavor)
    except environment.RankEnvironmentError as e:
        raise LaunchError(str(e)) from None
    for note in rank_env.notes:
        _warn(note)
    program = [interpreter_for(args.command[0])] + args.command[1:]
    variables = dict(rank_env.variables)
    if where.threads_per_rank and environment.THREAD_VARIABLE not in set(environ) | set(variables):
        # Ranks on other machines (a Slurm allocation): the source knows their CPUs per rank.
        variables[environment.THREAD_VARIABLE] = str(where.threads_per_rank)
    # Marks the job's processes, so that ending a broken job can find every rank left (supervise.py).
    variables[supervise.JOB_ID_VARIABLE] = uuid.uuid4().hex
    bootstrap = host_sources.FORK if all_local else where.bootstrap
    argv = command.build(launcher, where.np, where.hosts, bootstrap, variables, args.mpi_args, program)
    launch_env = dict(environ)
    # Also in the launcher's own environment: ranks started here inherit them whatever the
    # launcher's dialect, and the -genv/-x copies carry them to other hosts.
    launch_env.update(variables)
    return Launch(launcher.path, argv, launch_env, placed, where.reach)


def main(argv=None):
    args = cli.parse(sys.argv[1:] if argv is None else argv)
    if args.version:
        print(__version__)
        return 0
    if args.check_build:
        print(check_build.report())
        return 0
    if cli.is_elastic(args):
        from . import elastic_driver  # noqa: PLC0415 - only elastic runs need it

        return elastic_driver.main(args, os.environ, interpreter_for, usable_cores())
    try:
        launch = plan(args, os.environ)
    except LaunchError as e:
        print(f"{PROG}: error: {e}", file=sys.stderr)
        return 1
    if args.verbose:
        print(f"{PROG}: {shlex.join(launch.argv)}", file=sys.stderr)
    sys.stdout.flush()
    sys.stderr.flush()
    try:
        return supervise.run(launch.path, launch.argv, launch.env, launch.hosts, launch.reach)
    except OSError as e:
        print(f"{PROG}: error: cannot start {launch.path}: {e.strerror or e}", file=sys.stderr)
        return 1

