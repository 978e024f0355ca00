"""The session's clean-up of MPICH segments (shm_leftovers.py) removes what nothing uses and
keeps what a process still has open or mapped, and never touches what was there before."""
import mmap
import os
import uuid

import shm_leftovers


def _make(tag):
    path = f"/dev/shm/mpich_shm_test{uuid.uuid4().hex[:8]}_{tag}"
    with open(path, "wb") as f:
        f.write(b"\0" * 4096)
    return path


def test_removes_only_new_unused_segments():
    old = _make("old")
    before = shm_leftovers.segments()
    orphan, held, mapped = _make("orphan"), _make("held"), _make("mapped")
    held_file = open(held, "rb")
    mapped_fd = os.open(mapped, os.O_RDWR)
    mapping = mmap.mmap(mapped_fd, 4096)
    os.close(mapped_fd)  # only the mapping keeps it in use now
    try:
        shm_leftovers.remove_new(before)
        assert not os.path.exists(orphan)
        assert os.path.exists(held) and os.path.exists(mapped) and os.path.exists(old)
    finally:
        held_file.close()
        mapping.close()
        for path in (old, orphan, held, mapped):
            if os.path.exists(path):
                os.unlink(path)
