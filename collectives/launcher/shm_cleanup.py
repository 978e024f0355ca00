"""MPICH's shared-memory segments that a job's killed ranks leave in /dev/shm, removed by the
launcher that started those ranks once they are gone.

MPICH (ch4, 4.x/5.x) keeps its intra-host segments as files ``/dev/shm/mpich_shm_<world>_<node>``
(and ``mpich_vci_...``); the ranks remove them at MPI_Finalize, so a rank killed by a signal
leaves them behind (1-3 MB each; a development machine gathered 1.1 GB in a day of test runs),
and a container's 64 MB /dev/shm then fails the next job or elastic commit.

Which segments are the job's: a watch thread records every ``/dev/shm/mpich_*`` file that a
process of the job (one carrying the job's id in its environment, as supervise.py's sweep finds
them) maps, read from /proc/<pid>/maps while the ranks live; and the segments that appeared
while the job ran, for a rank killed before the watch saw its maps. Once no process of the job
is left, each of those is removed unless some process still maps it or holds it open (a job
running beside ours keeps its segments). Open files are read before mappings: MPICH opens a
segment, maps it, then closes it, so a segment being set up is seen in one or the other.

Only this machine's /dev/shm (and hosts sharing its kernel) is cleaned; remote hosts keep what
their killed ranks left.
"""
import glob
import os
import threading
import time

SHM_DIR = "/dev/shm"
PREFIX = "mpich_"
POLL_S = 1.0  # how often the watch reads the ranks' maps
GONE_WAIT_S = 5.0  # after the job ended, for killed ranks to exit (a dying process still maps)


def segments(directory=SHM_DIR):
    try:
        names = os.listdir(directory)
    except OSError:
        return set()
    return {os.path.join(directory, n) for n in names if n.startswith(PREFIX)}


def _shm_paths_in_maps(pid):
    found = set()
    try:
        with open(f"/proc/{pid}/maps") as f:
            for line in f:
                if f"{SHM_DIR}/" in line:
                    found.add(line.split(None, 5)[-1].strip().removesuffix(" (deleted)"))
    except OSError:
        pass  # the process ended, or is not ours to read
    return found


def in_use():
    """Paths under /dev/shm that some process holds open or maps (open files first: see above)."""
    used = set()
    for fd in glob.glob("/proc/[0-9]*/fd/*"):
        try:
            target = os.readlink(fd)
        except OSError:
            continue
        if target.startswith(f"{SHM_DIR}/"):
            used.add(target)
    for maps in glob.glob("/proc/[0-9]*/maps"):
        used |= _shm_paths_in_maps(maps.split("/")[2])
    return used


def job_pids(marker: bytes, this_host_only=False):
    """Pids whose environment holds ``marker`` (``NAME=value``), this process excluded;
    ``this_host_only``: in this process's network namespace (simulated hosts share a kernel)."""
    found = []
    try:
        mine = os.readlink("/proc/self/ns/net")
    except OSError:
        mine = None
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == os.getpid():
            continue
        try:
            if this_host_only and mine is not None and os.readlink(f"/proc/{name}/ns/net") != mine:
                continue
            with open(f"/proc/{name}/environ", "rb") as f:
                if marker in f.read().split(b"\0"):
                    found.append(int(name))
        except OSError:
            continue
    return found


def remove_unused(candidates):
    """Removes the candidates that still exist and nothing uses; returns (count, bytes)."""
    existing = {p for p in candidates if os.path.exists(p)}
    if not existing:
        return 0, 0
    used = in_use()
    count = size = 0
    for path in sorted(existing - used):
        try:
            st = os.stat(path)
            os.unlink(path)
        except FileNotFoundError:
            continue
        except OSError:
            continue  # not ours to remove (another user's)
        count += 1
        size += st.st_blocks * 512
    return count, size


class SegmentWatch:
    """The MPICH segments of one launch (one mpirun) whose processes carry ``marker``."""

    def __init__(self, marker: str):
        self.marker = marker.encode()
        self.before = segments()
        self.seen = set()
        self.stopped = threading.Event()
        self.thread = threading.Thread(target=self._watch, name="shm-segment-watch", daemon=True)
        self.thread.start()

    def _look(self):
        for pid in job_pids(self.marker):
            self.seen |= {p for p in _shm_paths_in_maps(pid) if os.path.basename(p).startswith(PREFIX)}

    def _watch(self):
        while not self.stopped.wait(POLL_S):
            self._look()

    def clean(self, wait_s=GONE_WAIT_S):
        """After the launch ended: waits (up to ``wait_s``) for the job's processes to be gone,
        then removes its segments that nothing uses; returns (count, bytes)."""
        self.stopped.set()
        self.thread.join(POLL_S + 1)
        deadline = time.monotonic() + wait_s
        while job_pids(self.marker, this_host_only=True) and time.monotonic() < deadline:
            time.sleep(0.1)
        return remove_unused(self.seen | (segments() - self.before))


def describe(count, size):
    return f"{count} MPICH shared-memory segment{'s' if count != 1 else ''} ({size / 1e6:.1f} MB)"
