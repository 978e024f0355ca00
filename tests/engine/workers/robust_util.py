"""Helpers for the robustness workers (errors, stall, shutdown, soak, timeline, large).

``wait`` polls a handle against a deadline, so a hang inside one case is reported with its
label instead of only as a whole-run timeout.
"""
import os
import re
import sys
import time

import collectives as hvd


def log(*parts):
    print(f"[rank {_rank()}]", *parts, file=sys.stderr, flush=True)


def _rank():
    try:
        return hvd.rank()
    except Exception:  # noqa: BLE001 - not initialized or already shut down
        return os.environ.get("PMI_RANK", os.environ.get("OMPI_COMM_WORLD_RANK", "?"))


def wait(handle, timeout, label):
    """synchronize(handle), but give up (and stop this rank) after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not hvd.poll(handle):
        if time.monotonic() > deadline:
            log(f"HANG: {label} did not complete within {timeout} s")
            os._exit(3)
        time.sleep(0.001)
    return hvd.synchronize(handle)


def expect_error(handle, exc_type, timeout, label):
    """Wait for ``handle`` and return (exception, seconds); AssertionError if it succeeded
    or failed with another type."""
    start = time.monotonic()
    try:
        wait(handle, timeout, label)
    except exc_type as e:
        return e, time.monotonic() - start
    raise AssertionError(f"{label}: completed without raising {exc_type.__name__}")


def wait_until(predicate, timeout, label):
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            log(f"HANG: {label} not reached within {timeout} s")
            os._exit(3)
        time.sleep(0.01)


def shape_in(message, shape):
    """True when ``message`` shows ``shape`` as [a, b] or (a, b)."""
    inner = r",\s*".join(str(int(d)) for d in shape)
    return re.search(r"[\[(]\s*" + inner + r"\s*,?\s*[\])]", message) is not None


def redirect_stderr(directory):
    """Send this rank's stderr (Python and the C++ engine alike) to <directory>/stderr.<rank>.

    Called before init(), so the rank comes from the launcher's environment.
    """
    rank = os.environ.get("PMI_RANK", os.environ.get("OMPI_COMM_WORLD_RANK", "0"))
    path = os.path.join(directory, f"stderr.{rank}")
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    sys.stderr.flush()
    os.dup2(fd, 2)
    os.close(fd)
    return path


def rss_bytes():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
