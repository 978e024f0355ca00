"""Commit files in COMMIT_DIR: written in the background, atomically, one newest file per rank.

A rank's commit is complete once its file is renamed into place as
``commit-<id>-g<generation>.rank<r>.ckpt``; before that it is a ``.tmp-...`` file that nothing
reads. After the rename the rank removes its older files, so each rank keeps only its newest.
Restarts read every rank's complete files (any rank of any generation on this host) and take
the newest by (commit id, generation): a commit rewritten by a later generation with the same
id wins over a stale one.

``submit`` returns at once: one writer thread writes the newest submitted commit; commits
submitted while it is busy replace each other (only the newest matters), so a commit never
waits for the disk. ``flush`` waits until the newest submitted commit is complete.
Files are not fsync'ed: they must outlive the process (the page cache does that), not the host,
whose loss takes the directory with it anyway.
"""
import errno
import os
import re
import sys
import threading
from dataclasses import dataclass

from .. import config
from . import commit_codec

BASE_DIR_VARIABLE = config.KNOBS["elastic_commit_base_dir"].env


class CommitSpaceError(OSError):
    """A commit does not fit its directory's filesystem; the message names the knob that moves it."""


_NAME = re.compile(r"^commit-(\d+)-g(\d+)\.rank(\d+)\.ckpt$")


@dataclass(frozen=True)
class CommitFile:
    commit_id: int
    generation: int
    rank: int
    path: str

    @property
    def key(self):
        return (self.commit_id, self.generation)


def file_name(commit_id, generation, rank):
    return f"commit-{commit_id:012d}-g{generation:06d}.rank{rank:05d}.ckpt"


def list_complete(directory):
    """Every complete commit file in ``directory`` (names only; headers are checked on read)."""
    try:
        names = os.listdir(directory)
    except FileNotFoundError:
        return []
    found = []
    for name in names:
        m = _NAME.match(name)
        if m:
            found.append(CommitFile(int(m.group(1)), int(m.group(2)), int(m.group(3)),
                                    os.path.join(directory, name)))
    return found


def read_file(commit_file):
    """The whole file as a bytearray (writable, so decoded arrays are writable), after checking
    its header against its size."""
    with open(commit_file.path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        data = bytearray(size)
        view = memoryview(data)
        got = 0
        while got < size:
            n = f.readinto(view[got:])
            if not n:
                break
            got += n
    commit_codec.read_header(data[:commit_codec.header_size()], got)
    return data


class CommitStore:
    """This rank's commit files; one background writer thread."""

    def __init__(self, directory, rank, generation):
        self.directory = directory
        self.rank = rank
        self.generation = generation
        os.makedirs(directory, exist_ok=True)
        self._remove_own_leftovers()
        self._cond = threading.Condition()
        self._pending = None  # (commit_id, obj) waiting to be written
        self._writing = False
        self._last_written = None  # commit id of this rank's newest complete file
        self._error = None  # the last write's failure (reported once, on stderr)
        self._thread = threading.Thread(target=self._writer, name="collectives-elastic-commit-writer", daemon=True)
        self._thread.start()

    def newest(self):
        """The newest complete commit file on this host that reads back whole, or None."""
        for candidate in sorted(list_complete(self.directory), key=lambda c: (c.key, -c.rank), reverse=True):
            try:
                with open(candidate.path, "rb") as f:
                    head = f.read(commit_codec.header_size())
                    size = os.fstat(f.fileno()).st_size
                commit_codec.read_header(head, size)
            except (OSError, commit_codec.CommitFormatError) as e:
                print(f"elastic: warning: rank {self.rank} skips {candidate.path}: {e}", file=sys.stderr, flush=True)
                continue
            return candidate
        return None

    def submit(self, commit_id, obj):
        """Queue ``obj`` (a picklable snapshot nobody mutates afterwards) as commit ``commit_id``."""
        with self._cond:
            self._pending = (commit_id, obj)
            self._cond.notify_all()

    def flush(self, timeout=None):
        """Wait until every submitted commit is written (or failed). True when the newest one is
        complete on disk."""
        with self._cond:
            self._cond.wait_for(lambda: self._pending is None and not self._writing, timeout)
            return self._pending is None and not self._writing and self._error is None

    @property
    def last_written(self):
        return self._last_written

    def _writer(self):
        while True:
            with self._cond:
                self._cond.wait_for(lambda: self._pending is not None)
                commit_id, obj = self._pending
                self._pending = None
                self._writing = True
            try:
                self._write(commit_id, obj)
                error = None
            except Exception as e:  # noqa: BLE001 - a failed write leaves the previous commit in place
                error = e
            with self._cond:
                self._writing = False
                if error is None:
                    self._last_written = commit_id
                elif self._error is None:
                    print(f"elastic: warning: rank {self.rank} could not write commit {commit_id} to "
                          f"{self.directory}: {error}; restarts will use an older commit",
                          file=sys.stderr, flush=True)
                self._error = error
                self._cond.notify_all()

    def _check_room(self, size):
        """CommitSpaceError before writing a commit that the directory's filesystem cannot hold
        (the rank's previous file stays until the new one is in place, so the whole size must
        be free): a full /dev/shm would also fail MPICH's next segment."""
        try:
            st = os.statvfs(self.directory)
        except OSError:
            return  # nothing to compare with: the write itself will tell
        free = st.f_bavail * st.f_frsize
        if size > free:
            raise CommitSpaceError(self._no_room(size, free))

    def _no_room(self, size, free):
        return (f"it needs {size / 1e6:.1f} MB and {self.directory} has {free / 1e6:.1f} MB free; set "
                f"{BASE_DIR_VARIABLE} to a directory with room (each job's commits go to "
                "<it>/collectives-elastic-<job>)")

    def _write(self, commit_id, obj):
        pieces = commit_codec.encode(commit_id, self.generation, obj)
        self._check_room(sum(memoryview(p).nbytes for p in pieces))
        final = os.path.join(self.directory, file_name(commit_id, self.generation, self.rank))
        tmp = os.path.join(self.directory, f".tmp-{os.getpid()}.rank{self.rank:05d}")
        try:
            with open(tmp, "wb") as f:
                for piece in pieces:
                    f.write(piece)
            os.replace(tmp, final)
        except BaseException as e:
            try:
                os.unlink(tmp)
            except OSError:
                pass
            if isinstance(e, OSError) and e.errno == errno.ENOSPC:  # other ranks filled it meanwhile
                size = sum(memoryview(p).nbytes for p in pieces)
                st = os.statvfs(self.directory)
                raise CommitSpaceError(self._no_room(size, st.f_bavail * st.f_frsize)) from None
            raise
        for old in list_complete(self.directory):
            if old.rank == self.rank and old.path != final:
                try:
                    os.unlink(old.path)
                except FileNotFoundError:
                    pass

    def _remove_own_leftovers(self):
        """Temporary files of this rank's earlier processes (killed mid-write)."""
        suffix = f".rank{self.rank:05d}"
        for name in os.listdir(self.directory):
            if name.startswith(".tmp-") and name.endswith(suffix):
                try:
                    os.unlink(os.path.join(self.directory, name))
                except FileNotFoundError:
                    pass
