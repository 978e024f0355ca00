"""Process sets (Horovod's ``hvd.ProcessSet``): subsets of the ranks that run collectives
among themselves. ``global_process_set`` is every rank. Adding and removing a set are
collective calls: every rank makes them, in the same order, whether or not it is a member.
"""
import numpy as np

from . import basics
from .constants import OpType
from .errors import InvalidArgumentError, raise_for_status

_registered = {}  # id -> ProcessSet, for the running engine


class ProcessSet:
    """A set of global ranks. Give ``ranks`` (a sequence of ints) or an mpi4py communicator
    whose processes form the set; it is usable once registered by ``add_process_set`` (or by
    ``init(process_sets=[...])``)."""

    def __init__(self, ranks_or_comm):
        self.process_set_id = None
        self._comm = None
        if hasattr(ranks_or_comm, "Get_group"):  # an mpi4py communicator
            self._comm = ranks_or_comm
            self.ranks = None
        else:
            self.ranks = sorted(int(r) for r in ranks_or_comm)

    def _resolve(self):
        if self.ranks is None:
            from mpi4py import MPI

            group = self._comm.Get_group()
            world = MPI.COMM_WORLD.Get_group()
            self.ranks = sorted(MPI.Group.Translate_ranks(group, list(range(group.Get_size())), world))
        return self.ranks

    def size(self):
        """Number of ranks in the set (None while not registered)."""
        return None if self.process_set_id is None else len(self.ranks)

    def rank(self):
        """This process's position within the set (None outside it, or not registered)."""
        if self.process_set_id is None or not self.included():
            return None
        return self.ranks.index(basics.rank())

    def included(self):
        """True if this process belongs to the set (None while not registered)."""
        if self.process_set_id is None:
            return None
        return basics.rank() in self.ranks

    def __repr__(self):
        return f"ProcessSet(process_set_id={self.process_set_id}, ranks={self.ranks})"


class _GlobalProcessSet(ProcessSet):
    """Every rank of the job; id 0, registered whenever the engine runs."""

    def __init__(self):
        super().__init__([])
        self.process_set_id = 0

    @property
    def ranks(self):
        return list(range(basics.size())) if basics.is_initialized() else []

    @ranks.setter
    def ranks(self, _value):
        pass  # fixed by the job

    def __repr__(self):
        return "ProcessSet(process_set_id=0, ranks=all)"


global_process_set = _GlobalProcessSet()


def process_set_id(process_set):
    """The engine id of ``process_set`` (None means the global set); raises if unregistered."""
    if process_set is None or process_set is global_process_set:
        return 0
    if not isinstance(process_set, ProcessSet):
        raise InvalidArgumentError(f"process_set must be a ProcessSet, not {type(process_set).__name__}")
    if process_set.process_set_id is None:
        raise InvalidArgumentError(f"{process_set!r} is not registered; call add_process_set() on every rank first")
    return process_set.process_set_id


def set_size(process_set):
    return basics.size() if process_set_id(process_set) == 0 else len(process_set.ranks)


def set_rank(process_set):
    """This rank's position in the set (its global rank for the global set)."""
    return basics.rank() if process_set_id(process_set) == 0 else process_set.ranks.index(basics.rank())


def _control(op, name, splits=(), root=0):
    """Run a negotiated control operation on every rank; returns the engine's value."""
    from .ops import control_request

    return control_request(op, name, splits, root)


_add_count = 0
_remove_count = 0


def add_process_set(process_set):
    """Register a process set (a ProcessSet or a sequence of ranks) on every rank; returns it.

    Every rank must call this, in the same order. Raises ValueError for a set with the same
    ranks as an existing one."""
    global _add_count
    ps = process_set if isinstance(process_set, ProcessSet) else ProcessSet(process_set)
    if ps.process_set_id is not None:
        raise InvalidArgumentError(f"{ps!r} is already registered")
    ranks = ps._resolve()
    name = f"process_set.add.{_add_count}"
    _add_count += 1
    ps.process_set_id = int(_control(OpType.PROCESS_SET_ADD, name, splits=ranks))
    _registered[ps.process_set_id] = ps
    return ps


def remove_process_set(process_set):
    """Unregister a process set on every rank (a collective call). Returns True if it was
    removed, False if it was not registered (the global set cannot be removed)."""
    global _remove_count
    if not isinstance(process_set, ProcessSet) or process_set.process_set_id in (None, 0):
        return False
    name = f"process_set.remove.{_remove_count}"
    _remove_count += 1
    _control(OpType.PROCESS_SET_REMOVE, name, root=process_set.process_set_id)
    _registered.pop(process_set.process_set_id, None)
    process_set.process_set_id = None
    return True


def forget_all():
    """The engine stopped: its sets are gone (ids restart with the next init)."""
    global _add_count, _remove_count
    for ps in _registered.values():
        ps.process_set_id = None
    _registered.clear()
    _add_count = _remove_count = 0
