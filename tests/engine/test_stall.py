"""Stall detection: a warning on rank 0 naming the tensor and the missing rank while a rank
is late (fresh and cached names, our variable and Horovod's), and the stall shutdown that
fails the waiting rank with StallTimeoutError and lets every process exit.
"""
import os
import re
import time

import pytest

from mpi_launch import run_workers


def read_stderr(directory, rank):
    path = os.path.join(directory, f"stderr.{rank}")
    with open(path, errors="replace") as f:
        return f.read()


def stall_env(**extra):
    env = {
        # Unset (empty counts as unset) anything that would change the stall behaviour.
        "COLLECTIVES_STALL_CHECK_TIME_SECONDS": "", "HOROVOD_STALL_CHECK_TIME_SECONDS": "",
        "COLLECTIVES_STALL_SHUTDOWN_TIME_SECONDS": "", "HOROVOD_STALL_SHUTDOWN_TIME_SECONDS": "",
        "COLLECTIVES_STALL_CHECK_DISABLE": "", "HOROVOD_STALL_CHECK_DISABLE": "",
        "COLLECTIVES_LOG_LEVEL": "", "HOROVOD_LOG_LEVEL": "",
    }
    env.update(extra)
    return env


def stall_warning(text, tensor, missing="[1]"):
    """The line of ``text`` warning that ``tensor`` stalled for want of ``missing``."""
    for line in text.splitlines():
        if "stall" in line.lower() and f"'{tensor}'" in line and missing in line:
            return line
    return None


def assert_warned(directory, tensor, run):
    err0 = read_stderr(directory, 0)
    line = stall_warning(err0, tensor)
    assert line, f"no stall warning for '{tensor}' naming rank [1] on rank 0's stderr:\n{err0}\n{run.describe()}"
    # The ranks that did submit are named too, and the missing one is not among them.
    assert re.search(r"not by ranks \[1\]", line) or "missing" in line.lower(), line
    return line


def test_stall_warning_fresh_and_cached(tmp_path):
    """Rank 1 is 5 s late; stall check 2 s: rank 0 warns about the fresh name and about the
    cached one (names the missing rank [1]), and both ops complete with the right result."""
    env = stall_env(COLLECTIVES_STALL_CHECK_TIME_SECONDS="2")
    run = run_workers(2, "stall_worker.py", tmp_path, "delay", "both", timeout=180, env=env, expect_success=False)
    outputs = "\n".join(f"--- stderr.{r} ---\n{read_stderr(tmp_path, r)}" for r in range(2))
    assert run.returncode == 0, run.describe() + outputs
    for r in range(2):
        assert f"[rank {r}] 2 passed, 0 failed" in run.stdout, run.describe() + outputs
    assert_warned(tmp_path, "stall.fresh", run)
    assert_warned(tmp_path, "stall.cached", run)
    # Rank 1 was never waiting on anything: it has nothing to warn about.
    assert stall_warning(read_stderr(tmp_path, 1), "stall.fresh") is None


def test_horovod_stall_check_variable_honoured(tmp_path):
    """HOROVOD_STALL_CHECK_TIME_SECONDS applies when COLLECTIVES_STALL_CHECK_TIME_SECONDS is
    unset (the default of 60 s would not warn within the 5 s delay)."""
    env = stall_env(HOROVOD_STALL_CHECK_TIME_SECONDS="2")
    run = run_workers(2, "stall_worker.py", tmp_path, "delay", "fresh", timeout=180, env=env, expect_success=False)
    outputs = "\n".join(f"--- stderr.{r} ---\n{read_stderr(tmp_path, r)}" for r in range(2))
    assert run.returncode == 0, run.describe() + outputs
    assert_warned(tmp_path, "stall.fresh", run)


def test_stall_check_disable(tmp_path):
    """COLLECTIVES_STALL_CHECK_DISABLE=1 silences the warning even with a short check time."""
    env = stall_env(COLLECTIVES_STALL_CHECK_TIME_SECONDS="2", COLLECTIVES_STALL_CHECK_DISABLE="1")
    run = run_workers(2, "stall_worker.py", tmp_path, "delay", "fresh", timeout=180, env=env, expect_success=False)
    err0 = read_stderr(tmp_path, 0)
    assert run.returncode == 0, run.describe() + err0
    assert stall_warning(err0, "stall.fresh") is None, err0


@pytest.mark.parametrize("waiter,kind", [(0, "fresh"), (1, "fresh"), (0, "cached")])
def test_stall_shutdown_raises_timeout_and_exits(tmp_path, waiter, kind):
    """COLLECTIVES_STALL_SHUTDOWN_TIME_SECONDS=3 (stall check time left at its default) and a
    tensor only rank ``waiter`` submits: that rank gets StallTimeoutError (a TimeoutError)
    after about 3 s -- not after the 60 s stall check time, also when the name is cached from
    earlier steps -- the other rank's engine stops too, later ops raise, and both processes
    exit 0 without calling shutdown()."""
    env = stall_env(COLLECTIVES_STALL_SHUTDOWN_TIME_SECONDS="3")
    start = time.monotonic()
    run = run_workers(2, "stall_worker.py", tmp_path, "never", waiter, kind, timeout=180, env=env,
                      expect_success=False)
    elapsed = time.monotonic() - start
    outputs = "\n".join(f"--- stderr.{r} ---\n{read_stderr(tmp_path, r)}" for r in range(2))
    assert run.returncode == 0, run.describe() + outputs
    for r in range(2):
        assert re.search(rf"\[rank {r}\] \d+ passed, 0 failed", run.stdout), run.describe() + outputs
    assert "StallTimeoutError after" in read_stderr(tmp_path, waiter), outputs
    assert elapsed < 120, f"took {elapsed:.0f} s"


@pytest.mark.parametrize("np_", [2, 3])
def test_stall_shutdown_breaks_a_deadlock(tmp_path, np_):
    """Each rank waits on a different tensor nobody else submits: with a 3 s stall shutdown
    time every rank gets StallTimeoutError naming its own tensor, and all exit 0."""
    env = stall_env(COLLECTIVES_STALL_SHUTDOWN_TIME_SECONDS="3")
    run = run_workers(np_, "stall_worker.py", tmp_path, "crossed", timeout=180, env=env, expect_success=False)
    outputs = "\n".join(f"--- stderr.{r} ---\n{read_stderr(tmp_path, r)}" for r in range(np_))
    assert run.returncode == 0, run.describe() + outputs
    for r in range(np_):
        assert f"[rank {r}] 1 passed, 0 failed" in run.stdout, run.describe() + outputs
