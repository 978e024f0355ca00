"""The launcher's argv in its own dialect.

MPICH's hydra (also Intel MPI, MVAPICH): ``-genv NAME VALUE`` for each variable (``-genvlist``
is not used: it switches hydra from passing the whole environment to passing only the list,
and may be given once); ``-launcher fork`` when every host is this machine, so no ssh is
involved; ``-hosts a:2,b:2`` otherwise.
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


def hydra_argv(launcher, np, hosts: Optional[List[Host]], all_local, variables, mpi_args, command):
    argv = [launcher, "-np", str(np)]
    if all_local:
        argv += ["-launcher", "fork"]  # every rank here: ranks are forked, no ssh to ourselves
    else:
        argv += ["-hosts", _host_list(hosts)]
    for name, value in variables.items():
        argv += ["-genv", name, value]
    return argv + list(mpi_args) + list(command)


def open_mpi_argv(launcher, version, np, hosts, all_local, variables, mpi_args, command):
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


def build(launcher, np, hosts, all_local, variables, mpi_args_text, command):
    """argv for ``launcher`` (an mpi_locator.MpiLauncher)."""
    mpi_args = shlex.split(mpi_args_text) if mpi_args_text else []
    if launcher.flavor == HYDRA:
        return hydra_argv(launcher.path, np, hosts, all_local, variables, mpi_args, command)
    if launcher.flavor == OPEN_MPI:
        return open_mpi_argv(launcher.path, launcher.version, np, hosts, all_local, variables, mpi_args, command)
    return generic_argv(launcher.path, np, variables, mpi_args, command)
