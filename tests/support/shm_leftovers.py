"""MPICH's shared-memory segments left behind by the tests' jobs.

MPICH (ch3:nemesis) names its intra-host segments /dev/shm/mpich_shm_*; a job whose ranks are
killed (the elastic, watchdog and failure tests do that on purpose) leaves them behind, about
1-3 MB each, and a CI run made some 46 of them. The test session removes those that appeared
while it ran and that no process still maps or holds open: a segment of a job still running (a
test's, or anything else on this machine) is in use by its ranks and is left alone.
"""
import glob
import os

PATTERN = "/dev/shm/mpich_shm_*"


def segments():
    return set(glob.glob(PATTERN))


def in_use():
    """Paths under /dev/shm that some process maps or has open (the ones we can see)."""
    used = set()
    for maps in glob.glob("/proc/[0-9]*/maps"):
        try:
            with open(maps) as f:
                for line in f:
                    if "/dev/shm/" in line:
                        used.add(line.split(None, 5)[-1].strip().removesuffix(" (deleted)"))
        except OSError:
            continue  # the process ended, or is not ours to read
    for fd in glob.glob("/proc/[0-9]*/fd/*"):
        try:
            target = os.readlink(fd)
        except OSError:
            continue
        if target.startswith("/dev/shm/"):
            used.add(target)
    return used


def remove_new(before):
    """Removes the segments not in `before` that nothing uses; returns how many."""
    new = segments() - before
    if not new:
        return 0
    used = in_use()
    removed = 0
    for path in sorted(new - used):
        try:
            os.unlink(path)
            removed += 1
        except FileNotFoundError:
            pass
    return removed
