"""``collectives.run(func, args=(), kwargs=None, np=N, ...)``: Horovod's ``horovod.run``.

The function, its arguments and the results travel as cloudpickle files in a private
directory of this machine (so ``hosts`` other than this one need that directory on a shared
filesystem, as the worker reads it at the same path). The ranks are started by the same
launcher as ``collectivesrun``; each runs ``func(*args, **kwargs)`` (which calls
``collectives.init()`` itself, as under Horovod) and writes its return value or exception.
"""
import os
import shutil
import subprocess
import sys
import tempfile

import cloudpickle

from .function_worker import ERROR, PAYLOAD, result_path


class RunError(RuntimeError):
    """The job ended without a result from every rank and no rank reported an exception."""


def run(func, args=(), kwargs=None, np=1, hosts=None, hostfile=None, env=None, verbose=False,
        start_timeout=None, launcher_args=(), timeout=None):
    """Run ``func(*args, **kwargs)`` on ``np`` ranks; returns the list of the ranks' return
    values in rank order. An exception on a rank is raised here (the first rank's that was
    not merely a consequence of another's failure), with the rank and its traceback noted.

    ``hosts``: "host1:2,host2:2" as ``collectivesrun -H``; ``hostfile``: a path; ``env``: the
    ranks' environment (default: this process's); ``launcher_args``: more ``collectivesrun``
    arguments (e.g. ``["--fusion-threshold-mb", "32"]``); ``timeout``: seconds, then the job is
    killed and RunError raised.
    """
    if not callable(func):
        raise TypeError(f"run() needs a callable, not {type(func).__name__}")
    if not isinstance(np, int) or isinstance(np, bool) or np < 1:
        raise ValueError(f"np must be a positive int, not {np!r}")
    directory = tempfile.mkdtemp(prefix="collectives-run-")
    try:
        with open(os.path.join(directory, PAYLOAD), "wb") as f:
            cloudpickle.dump((func, tuple(args), dict(kwargs or {})), f)
        command = [sys.executable, "-m", "collectives.run", "-np", str(np)]
        if hosts:
            command += ["-H", hosts]
        if hostfile:
            command += ["--hostfile", str(hostfile)]
        if start_timeout is not None:
            command += ["--start-timeout", str(start_timeout)]
        if verbose:
            command += ["--verbose"]
        command += list(launcher_args)
        command += [sys.executable, "-m", "collectives.launcher.function_worker", directory]
        launch_env = _rank_environment(env)
        if not (hosts or hostfile):
            # Horovod's run() without hosts means this machine, whose temporary directory holds the
            # results; inside a Slurm allocation collectivesrun would otherwise use its nodes.
            launch_env.pop("SLURM_JOB_ID", None)
        try:
            job = subprocess.run(command, env=launch_env, capture_output=not verbose,
                                 text=True, timeout=timeout)
        except subprocess.TimeoutExpired:
            raise RunError(f"collectives.run: the job did not finish within {timeout} s and was killed") from None
        outcomes = _read_outcomes(directory, np)
    finally:
        shutil.rmtree(directory, ignore_errors=True)
    _raise_first_error(outcomes)
    missing = [r for r in range(np) if r not in outcomes]
    if missing or job.returncode != 0:
        tail = (job.stderr or "")[-2000:] if not verbose else ""
        raise RunError(f"collectives.run: the job exited with status {job.returncode} and ranks {missing} "
                       f"returned no result" + (f"\n{tail}" if tail else ""))
    return [outcomes[r][1] for r in range(np)]


def _rank_environment(env):
    """The ranks' environment, with this process's import path: a function is pickled by
    reference to its module (unless defined in __main__), which the ranks must import too."""
    rank_env = dict(os.environ if env is None else env)
    paths = [p or os.getcwd() for p in sys.path]
    if rank_env.get("PYTHONPATH"):
        paths.append(rank_env["PYTHONPATH"])
    rank_env["PYTHONPATH"] = os.pathsep.join(paths)
    return rank_env


def _read_outcomes(directory, np):
    outcomes = {}
    for r in range(np):
        path = result_path(directory, r)
        if os.path.exists(path):
            with open(path, "rb") as f:
                outcomes[r] = cloudpickle.load(f)
    return outcomes


def _raise_first_error(outcomes):
    errors = [(r, o) for r, o in sorted(outcomes.items()) if o[0] == ERROR]
    if not errors:
        return
    from ..errors import ShutdownError, StallTimeoutError, TensorMismatchError

    # Other ranks often fail only because one rank did (its peers see ShutdownError, or its
    # shared failure): report the cause.
    consequences = (ShutdownError, StallTimeoutError, TensorMismatchError)
    causes = [e for e in errors if not isinstance(e[1][1], consequences)] or errors
    rank, (_, error, remote_traceback) = causes[0]
    note = f"raised on rank {rank} of collectives.run; its traceback:\n{remote_traceback}"
    if hasattr(error, "add_note"):
        error.add_note(note)
        raise error
    raise RuntimeError(f"rank {rank}: {type(error).__name__}: {error}\n{note}") from error

