import os
import sys

# The test drivers import the shared helpers (mpi_launch, simhosts, ...) from tests/support.
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "support"))

import shm_leftovers  # noqa: E402  (found through the path above)

_segments_at_start = set()


def pytest_sessionstart(session):
    _segments_at_start.update(shm_leftovers.segments())


def pytest_sessionfinish(session, exitstatus):
    removed = shm_leftovers.remove_new(_segments_at_start)
    if removed:
        print(f"\nremoved {removed} shared-memory segments that killed MPICH jobs left in /dev/shm")
