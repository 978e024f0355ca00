"""The session's clean-up of MPICH segments (shm_leftovers.py) removes what nothing uses and
keeps what a process still has open or mapped, and never touches what was there before; and
collectivesrun removes the segments of the ranks it started once they are killed, keeping
those of a job running beside (the elastic driver's clean-up: tests/elastic/test_elastic_driver.py)."""
import mmap
import os
import signal
import subprocess
import sys
import time
import uuid

import shm_leftovers
from mpi_launch import worker_env, worker_path


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


# ----------------------------------------------------------------- the launcher's own clean-up

COLLECTIVESRUN = os.path.join(os.path.dirname(sys.executable), "collectivesrun")
WORKER = worker_path("shm_segments_worker.py")


def _reported(prefix, np_):
    found = []
    for r in range(np_):
        try:
            with open(f"{prefix}.rank{r}") as f:
                found += f.read().split()
        except FileNotFoundError:
            pass
    return found


def test_collectivesrun_removes_its_killed_ranks_segments_and_keeps_a_running_jobs(tmp_path):
    """Issue 35 item 9: a job whose rank is SIGKILLed leaves no MPICH segment behind, while a
    second job running beside it keeps its own (mapped) segments and finishes normally."""
    go, beside_report, killed_report = tmp_path / "go", str(tmp_path / "beside"), str(tmp_path / "killed")
    beside = subprocess.Popen([COLLECTIVESRUN, "-np", "2", sys.executable, WORKER, "--report", beside_report,
                               "--wait-for", str(go)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              env=worker_env(), start_new_session=True)
    try:
        deadline = time.monotonic() + 90
        while len(_reported(beside_report, 2)) < 2 and beside.poll() is None and time.monotonic() < deadline:
            time.sleep(0.2)
        kept = sorted(set(_reported(beside_report, 2)))
        assert kept, "the job beside reported no MPICH segment (did MPICH change how it names them?)"
        killed = subprocess.run([COLLECTIVESRUN, "-np", "2", sys.executable, WORKER, "--report", killed_report,
                                 "--die-rank", "1"], capture_output=True, text=True, env=worker_env(), timeout=120)
        out = f"exit {killed.returncode}\n{killed.stdout}\n{killed.stderr}"
        assert killed.returncode != 0, out
        theirs = sorted(set(_reported(killed_report, 2)))
        assert theirs and not set(theirs) & set(kept), out
        left = [p for p in theirs if os.path.exists(p)]
        assert not left, f"left in /dev/shm by the killed job: {left}\n{out}"
        assert all(os.path.exists(p) for p in kept), "a segment of the job running beside was removed"
        go.touch()
        b_out, b_err = beside.communicate(timeout=60)
        assert beside.returncode == 0, f"{b_out}\n{b_err}"
    finally:
        if beside.poll() is None:
            os.killpg(beside.pid, signal.SIGKILL)
            beside.wait()
