"""The launcher's argv in its own dialect.

MPICH's hydra (also Intel MPI, MVAPICH): ``-genv NAME VALUE`` for each variable (``-genvlist``
is not used: it switches hydra from passing the whole environment to passing only the list,
and may be given once); ``-launcher fork`` when every host is this machine, so no ssh is
involved; ``-hosts a:2,b:2`` otherwise, reached over ssh, or with ``-launcher slurm`` inside a
Slurm allocation (hydra starts its proxies as one srun step).

The bootstrap (how the launcher reaches the hosts) is "fork", "ssh" or "slurm"
(host_sources.FORK/SSH/SLURM); True and False mean "fork" and "ssh".
Open MPI: ``-x NAME=VALUE``; ``-H localhost:N`` on one machine (its default of one slot per
core would refuse N > cores); ``--bind-to none`` so ranks and their threads are not pinned to
one core each; oversubscription allowed explicitly.
"""
import os
import shlex
from typing import List, Optional

from .hosts import Host
from .mpi_locator import HYDRA, OPEN_MPI


def _host_list(hosts: List[Host]):
    return ",".join(f"{h.name}:{h.slots}" if ":" not in h.name else f"[{h.name}]:{h.slots}" for h in hosts)


# hydra's flags for each bootstrap; every rank here: ranks are forked, no ssh to ourselves.
HYDRA_BOOTSTRAP = {"fork": ["-launcher", "fork"], "ssh": [], "slurm": ["-launcher", "slurm"]}


def _bootstrap(value):
    return {True: "fork", False: "ssh"}.get(value, value) if isinstance(value, bool) else value


def hydra_argv(launcher, np, hosts: Optional[List[Host]], bootstrap, variables, mpi_args, command):
    bootstrap = _bootstrap(bootstrap)
    argv = [launcher, "-np", str(np)] + HYDRA_BOOTSTRAP[bootstrap]
    if bootstrap != "fork":
        argv += ["-hosts", _host_list(hosts)]
    for name, value in variables.items():
        argv += ["-genv", name, value]
    return argv + list(mpi_args) + list(command)


def open_mpi_argv(launcher, version, np, hosts, bootstrap, variables, mpi_args, command):
    """Open MPI's mpirun finds a Slurm allocation itself and starts its daemons with srun."""
    all_local = _bootstrap(bootstrap) == "fork"
    argv = [launcher, "-np", str(np)]
    argv += ["-H", f"localhost:{np}" if all_local else _host_list(hosts)]
    major = int(version.split(".")[0]) if version.split(".")[0].isdigit() else 4
    # Open MPI 5 deprecates --oversubscribe in favour of the mapping modifier.
    argv += ["--bind-to", "none"] + (["--map-by", "slot:OVERSUBSCRIBE"] if major >= 5
                                      else ["--map-by", "slot", "--oversubscribe"])
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        argv.append("--allow-run-as-root")  # containers commonly run as root; Open MPI refuses by default
    for name, value in variables.items():
        argv += ["-x", f"{name}={value}"]
    return argv + list(mpi_args) + list(command)


def generic_argv(launcher, np, variables, mpi_args, command):
    """An MPI we do not recognise: only -np; the variables travel in the environment."""
    return [launcher, "-np", str(np)] + list(mpi_args) + list(command)


def build(launcher, np, hosts, bootstrap, variables, mpi_args_text, command):
    """argv for ``launcher`` (an mpi_locator.MpiLauncher); ``bootstrap`` as above."""
    mpi_args = shlex.split(mpi_args_text) if mpi_args_text else []
    if launcher.flavor == HYDRA:
        return hydra_argv(launcher.path, np, hosts, bootstrap, variables, mpi_args, command)
    if launcher.flavor == OPEN_MPI:
        return open_mpi_argv(launcher.path, launcher.version, np, hosts, bootstrap, variables, mpi_args, command)
    return generic_argv(launcher.path, np, variables, mpi_args, command)
