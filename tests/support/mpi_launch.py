"""Runs a worker script under the real mpirun with a hard timeout.

Every multi-process test goes through ``run_workers``: the ranks are real processes started
by the MPICH launcher installed beside this Python, and a run that exceeds its timeout is
killed as a whole process group and reported as a failure with whatever it printed.
"""
import glob
import os
import re
import signal
import subprocess
import sys
from dataclasses import dataclass

from hang_report import native_stacks

# tests/support: these helpers and the modules workers share (common.py, ops_util.py); on every
# worker's PYTHONPATH.
SUPPORT = os.path.dirname(os.path.abspath(__file__))
TESTS = os.path.dirname(SUPPORT)


def worker_path(script):
    """The path of a worker: ``script`` itself when it names a directory (an absolute path, a
    benchmark), else the one file of that name among the areas' worker folders
    (tests/<area>/workers/), so that a test names its worker alone wherever the two live."""
    if os.path.dirname(script):
        return script
    found = sorted(glob.glob(os.path.join(TESTS, "*", "workers", script)))
    if len(found) != 1:
        where = ", ".join(os.path.relpath(f, TESTS) for f in found) or "none"
        raise FileNotFoundError(f"worker {script!r}: expected exactly one tests/<area>/workers/{script}, found {where}")
    return found[0]


def with_support_path(env):
    """``env`` with tests/support first on PYTHONPATH (the workers' shared modules)."""
    return dict(env, PYTHONPATH=os.pathsep.join(filter(None, [SUPPORT, env.get("PYTHONPATH")])))


def mpirun_path():
    beside = os.path.join(os.path.dirname(sys.executable), "mpirun")
    return beside if os.path.exists(beside) else "mpirun"


@dataclass
class Run:
    returncode: int
    stdout: str
    stderr: str

    def describe(self):
        return f"exit code {self.returncode}\n--- stdout ---\n{self.stdout}\n--- stderr ---\n{self.stderr}"


def worker_env(env=None):
    """The environment of a worker's ranks: this one, one compute thread per rank (the machine
    has 2 cores and tests oversubscribe it), unbuffered output, tests/support on PYTHONPATH (for
    the workers' shared modules), then ``env``."""
    full_env = with_support_path(os.environ)
    full_env.setdefault("OMP_NUM_THREADS", "1")
    full_env.setdefault("PYTHONUNBUFFERED", "1")
    if env:
        full_env.update(env)
    return full_env


def run_workers(np, script, *args, timeout=120, env=None, expect_success=True):
    """Launch ``script`` (a worker's name, see worker_path, or a path) on ``np`` ranks; returns a Run.

    With expect_success, a non-zero exit fails the calling test with the full output.
    """
    full_env = worker_env(env)
    cmd = [mpirun_path(), "-np", str(np), sys.executable, worker_path(script), *map(str, args)]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=full_env,
                            start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        stacks = native_stacks(proc.pid)
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        raise AssertionError(f"{script} on {np} ranks timed out after {timeout} s (killed)\n"
                             f"--- stdout ---\n{out}\n--- stderr ---\n{err}\n"
                             f"--- stacks at the timeout ---\n{stacks}")
    run = Run(proc.returncode, out, err)
    if expect_success and run.returncode != 0:
        raise AssertionError(f"{script} on {np} ranks failed: {run.describe()}")
    return run


def assert_all_ranks_passed(run, np, min_cases=1):
    """Every rank printed its Checker summary ("[rank R] N passed, M failed") with no failures
    and at least ``min_cases`` cases (guards against ranks that exit silently)."""
    found = re.findall(r"\[rank (\d+)\] (\d+) passed, (\d+) failed", run.stdout)
    ranks = sorted(int(r) for r, _, _ in found)
    assert ranks == list(range(np)), f"summaries from ranks {ranks}, expected {list(range(np))}:\n{run.describe()}"
    for r, passed, failed in found:
        assert int(failed) == 0, f"rank {r}: {failed} failed\n{run.describe()}"
        assert int(passed) >= min_cases, f"rank {r} ran only {passed} cases\n{run.describe()}"


def assert_same_digests(run, reference, what, minimum=100):
    """Workers print "digest LABEL SHA1" per result (tests/engine/workers/hierarchical_worker.py): both
    runs must have digested the same cases, at least ``minimum``, with equal results."""
    ours, theirs = (dict(re.findall(r"digest (.+?) ([0-9a-f]{40})", r.stdout)) for r in (run, reference))
    assert len(ours) >= minimum, run.describe()
    assert ours.keys() == theirs.keys(), sorted(set(ours) ^ set(theirs))[:5]
    differ = [label for label in ours if ours[label] != theirs[label]]
    assert not differ, f"{what}: {differ[:5]}"
