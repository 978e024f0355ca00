"""``collectivesrun`` (also ``python -m collectives.run``): start N ranks of a training script
with the MPI launcher the engine was built with.

    collectivesrun -np 4 [-H host1:2,host2:2 | --hostfile FILE] [--fusion-threshold-mb N]
                   [--cycle-time-ms N] [--timeline-filename F] [--stall-check-time S]
                   [-x VAR=VALUE | -x VAR]... python train.py ...
    collectivesrun --check-build

It checks everything it can before starting anything (the launcher exists and runs, every host
resolves and remote ones answer ssh, knob values parse), so a bad setup ends with one line
saying what is wrong and a non-zero exit instead of a hang; then it replaces itself with the
launcher (exec), so signals and the exit status are the launcher's own. Plain
``mpirun -np N python train.py`` keeps working: nothing here is required at run time.
"""
import os
import shlex
import shutil
import sys

from . import __version__
from .launcher import args as cli
from .launcher import check_build, command, environment, hosts as hostspec, mpi_locator, reachability

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


def _placement(args, timeout):
    """(host list or None, every host is this machine, ranks on this machine or None)."""
    if args.hosts:
        hosts = hostspec.parse_host_list(args.hosts)
    elif args.hostfile:
        hosts = hostspec.parse_hostfile(args.hostfile)
    else:
        return None, True, args.np
    statuses = reachability.check_hosts([h.name for h in hosts], timeout)
    all_local = all(statuses[h.name].local for h in hosts)
    if not all_local:
        for h in hosts:
            if statuses[h.name].loopback_only:
                # Ranks on the other hosts would try to reach this one at their own loopback.
                raise hostspec.HostSpecError(f"host '{h.name}' is a loopback name; with other hosts in the job, "
                                             "name this machine by its network name or address")
    counts = hostspec.ranks_per_host(args.np, hosts)
    slots = sum(h.slots for h in hosts)
    if args.np > slots:
        _warn(f"{args.np} ranks on {slots} slots: hosts take more ranks than their slots")
    local = sum(n for h, n in zip(hosts, counts) if statuses[h.name].local)
    return hosts, all_local, local or None


def plan(args, environ):
    """(launcher path, argv, environment for the launcher) or LaunchError."""
    try:
        launcher = mpi_locator.locate(environ)
    except mpi_locator.LauncherError as e:
        raise LaunchError(str(e)) from None
    for w in launcher.warnings:
        _warn(w)
    try:
        hosts, all_local, local_ranks = _placement(args, args.start_timeout)
    except (hostspec.HostSpecError, reachability.UnreachableHostError) as e:
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
    argv = command.build(launcher, args.np, hosts, all_local, rank_env.variables, args.mpi_args, program)
    launch_env = dict(environ)
    # Also in the launcher's own environment: ranks started here inherit them whatever the
    # launcher's dialect, and the -genv/-x copies carry them to other hosts.
    launch_env.update(rank_env.variables)
    return launcher.path, argv, launch_env


def main(argv=None):
    args = cli.parse(sys.argv[1:] if argv is None else argv)
    if args.version:
        print(__version__)
        return 0
    if args.check_build:
        print(check_build.report())
        return 0
    try:
        path, launcher_argv, env = plan(args, os.environ)
    except LaunchError as e:
        print(f"{PROG}: error: {e}", file=sys.stderr)
        return 1
    if args.verbose:
        print(f"{PROG}: {shlex.join(launcher_argv)}", file=sys.stderr)
    sys.stdout.flush()
    sys.stderr.flush()
    try:
        os.execve(path, launcher_argv, env)
    except OSError as e:
        print(f"{PROG}: error: cannot start {path}: {e.strerror or e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
