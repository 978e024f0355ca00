"""MPICH's shared-memory segments left behind by the tests' jobs.

MPICH (ch3:nemesis) names its intra-host segments /dev/shm/mpich_shm_*; a job whose ranks are
killed (the elastic, watchdog and failure tests do that on purpose) leaves them behind, about
1-3 MB each, and a CI run made some 46 of them. collectivesrun and its elastic driver now
remove those of the ranks they started (collectives/launcher/shm_cleanup.py); the jobs the tests
start with a bare mpirun still leave them, so the test session removes those that appeared
while it ran and that no process still maps or holds open: a segment of a job still running (a
test's, or anything else on this machine) is in use by its ranks and is left alone.
"""
import glob
import os

from collectives.launcher import shm_cleanup

PATTERN = "/dev/shm/mpich_shm_*"


def segments():
    return set(glob.glob(PATTERN))


def in_use():
    """Paths under /dev/shm that some process maps or has open (the launchers' own check)."""
    return shm_cleanup.in_use()


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
