"""Inside a Slurm allocation (``sbatch``, ``salloc``): the nodes and task counts Slurm gave the job,
read from the environment Slurm sets, and how a node is probed after a failure.

    SLURM_JOB_ID          the allocation (its presence is what "inside" means)
    SLURM_JOB_NODELIST    compressed node list, e.g. node[01-04,07] (older Slurm: SLURM_NODELIST)
    SLURM_TASKS_PER_NODE  task counts per node, e.g. 2(x3),1; absent: SLURM_NTASKS spread
                          over the nodes as Slurm's block distribution does, else one per node
    SLURM_CPUS_PER_TASK   (--cpus-per-task) each rank's OMP_NUM_THREADS unless set; without
    SLURM_JOB_CPUS_PER_NODE   it, the fewest CPUs per rank of any node (same format as tasks)

The ranks start through Slurm: MPICH's hydra with ``-launcher slurm`` runs its proxies as one
``srun`` step (one per node), so they are inside the job's step, accounted and cleaned up by
Slurm, and no ssh is needed. After a failure, a node is probed by connecting to its slurmd port
(SlurmdPort in slurm.conf, 6818 by default): a crashed node refuses or does not answer.
"""
import re
import socket
import subprocess
from dataclasses import dataclass
from typing import List, Optional

from . import hosts as hostspec
from . import slurm_nodelist

JOB_VARIABLE = "SLURM_JOB_ID"
NODELIST_VARIABLES = ("SLURM_JOB_NODELIST", "SLURM_NODELIST")
DEFAULT_SLURMD_PORT = 6818
PROBE_TIMEOUT_S = 3.0


class SlurmAllocationError(ValueError):
    """The allocation's environment cannot be read; one line for the user."""


@dataclass(frozen=True)
class Allocation:
    job_id: str
    hosts: List[hostspec.Host]  # each node with its task count as slots

    @property
    def tasks(self):
        return sum(h.slots for h in self.hosts)


def inside(environ) -> bool:
    return bool(environ.get(JOB_VARIABLE))


def _block_counts(ntasks, nodes):
    """SLURM_NTASKS over ``nodes`` nodes as Slurm's default block distribution gives them
    when no per-node counts are known: as even as possible, the first nodes taking the extra."""
    base, extra = divmod(ntasks, nodes)
    return [base + (1 if i < extra else 0) for i in range(nodes)]


def check_not_in_a_step(environ):
    """``srun collectivesrun ...`` would start the whole job once per task of the step."""
    tasks = environ.get("SLURM_STEP_NUM_TASKS", "")
    if environ.get("SLURM_STEP_ID") is not None and tasks.isdigit() and int(tasks) > 1:
        raise SlurmAllocationError(f"collectivesrun is running in each of the {tasks} tasks of an srun step "
                                   f"(SLURM_STEP_ID={environ['SLURM_STEP_ID']}): each would start the whole job; run "
                                   "it once, in the batch script or the salloc shell, or run `srun --mpi=pmi2 python "
                                   "train.py` without it")


def read(environ) -> Allocation:
    check_not_in_a_step(environ)
    job_id = environ.get(JOB_VARIABLE, "")
    text = next((environ[v] for v in NODELIST_VARIABLES if environ.get(v)), None)
    if text is None:
        raise SlurmAllocationError(f"{JOB_VARIABLE}={job_id} is set but SLURM_JOB_NODELIST is not: not a Slurm "
                                   "allocation's environment (give -np and -H to run outside Slurm)")
    try:
        names = slurm_nodelist.hostnames(text, dict(environ))
        tasks_text = environ.get("SLURM_TASKS_PER_NODE")
        if tasks_text:
            counts = slurm_nodelist.expand_tasks(tasks_text)
        elif environ.get("SLURM_NTASKS", "").isdigit():
            counts = _block_counts(int(environ["SLURM_NTASKS"]), len(names))
        else:
            counts = [1] * len(names)
    except slurm_nodelist.SlurmListError as e:
        raise SlurmAllocationError(f"Slurm allocation {job_id}: {e}") from None
    if len(counts) != len(names):
        raise SlurmAllocationError(f"Slurm allocation {job_id}: {len(names)} nodes in {text!r} but {len(counts)} "
                                   f"task counts in SLURM_TASKS_PER_NODE={tasks_text!r}")
    hosts = [hostspec.Host(name, n) for name, n in zip(names, counts) if n > 0]
    if not hosts:
        raise SlurmAllocationError(f"Slurm allocation {job_id} has no tasks")
    return Allocation(job_id, hosts)


def threads_per_rank(environ, alloc: Allocation, np_) -> Optional[int]:
    """Compute threads per rank: --cpus-per-task when given, else the fewest CPUs per rank over
    the nodes (ranks placed as hosts.ranks_per_host places them); None when unknown."""
    given = environ.get("SLURM_CPUS_PER_TASK", "")
    if given.isdigit() and int(given) > 0:
        return int(given)
    try:
        cpus = slurm_nodelist.expand_tasks(environ.get("SLURM_JOB_CPUS_PER_NODE", ""))
    except slurm_nodelist.SlurmListError:
        return None
    if len(cpus) != len(alloc.hosts):
        return None
    ranks = hostspec.ranks_per_host(np_, alloc.hosts)
    return max(1, min(c // r for c, r in zip(cpus, ranks) if r)) if any(ranks) else None


def slurmd_port(environ) -> int:
    """SlurmdPort from ``scontrol show config``, else the default."""
    try:
        proc = subprocess.run(["scontrol", "show", "config"], capture_output=True, text=True, timeout=PROBE_TIMEOUT_S,
                              stdin=subprocess.DEVNULL, env=dict(environ))
    except (subprocess.TimeoutExpired, OSError):
        return DEFAULT_SLURMD_PORT
    m = re.search(r"^SlurmdPort\s*=\s*(\d+)", proc.stdout, re.M)
    return int(m.group(1)) if m else DEFAULT_SLURMD_PORT


class SlurmdReach:
    """supervise's probe for Slurm nodes: a TCP connection to the node's slurmd. No sweep:
    ending the launcher ends its srun step, and Slurm kills the step's processes on every node
    it can reach."""

    what = "on its slurmd port"

    def __init__(self, environ):
        self.environ = dict(environ)
        self._port: Optional[int] = None

    def probe(self, name, timeout=PROBE_TIMEOUT_S) -> Optional[str]:
        if self._port is None:
            self._port = slurmd_port(self.environ)
        try:
            with socket.create_connection((name, self._port), timeout=timeout):
                return None
        except socket.timeout:
            return f"no answer within {timeout:g} s"
        except OSError as e:
            return f"port {self._port}: {(e.strerror or str(e)).lower()}"

    def sweep(self, name, job_id):
        pass

