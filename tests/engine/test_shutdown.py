"""Shutdown with operations pending, and interpreter exit without shutdown(): pending
handles complete with ShutdownError (never hang), every process exits with status 0."""
import re
import time

import pytest

from mpi_launch import run_workers

MODES = {
    # mode: what it shows
    "peer_shutdown": "rank 1 calls shutdown(): rank 0's pending op raises ShutdownError, later ops raise",
    "self_shutdown": "rank 0 calls shutdown() with its own op pending: the handle raises ShutdownError",
    "peer_exit": "rank 1 exits without shutdown(): rank 0's pending op raises ShutdownError",
    "thread_blocked": "a thread blocked in allreduce gets ShutdownError when the main thread shuts down",
    "exit_clean": "init, one op, exit without shutdown(): no hang",
    "exit_pending": "exit with an async op pending (never synchronized): no hang",
    "exit_daemon": "exit with a daemon thread blocked in allreduce: no hang",
    "reinit": "shutdown() then init() again works",
}


@pytest.mark.parametrize("mode", list(MODES))
def test_shutdown_modes(mode):
    start = time.monotonic()
    run = run_workers(2, "shutdown_worker.py", mode, timeout=120)
    elapsed = time.monotonic() - start
    for rank in range(2):
        m = re.search(rf"\[rank {rank}\] (\d+) passed, (\d+) failed", run.stdout)
        assert m and m.group(2) == "0" and int(m.group(1)) >= 1, f"{MODES[mode]}\n{run.describe()}"
    if mode in ("peer_shutdown", "peer_exit"):
        assert "orphan failed after" in run.stderr, run.describe()
    assert elapsed < 90, f"{mode} took {elapsed:.0f} s"
