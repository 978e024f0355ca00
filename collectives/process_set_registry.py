"""Process sets as the engine knows them: the ``ProcessSet`` object, the global set, and the
registry of ids of the running engine. Registering and removing sets are collective calls
that need the ops layer; they live one layer up, in process_sets.py, so that the ops can use
this module without a cycle.
"""
from . import basics
from .errors import ArgumentTypeError, InvalidArgumentError, UnregisteredProcessSetError

_registered = {}  # id -> ProcessSet, for the running engine


class ProcessSet:
    """A set of global ranks. Give ``ranks`` (a sequence of ints) or an mpi4py communicator
    whose processes form the set; it is usable once registered by ``add_process_set`` (or by
    ``init(process_sets=[...])``)."""

    def __init__(self, ranks_or_comm):
        self.process_set_id = None
        self.mpi_comm = None  # Horovod's attribute name
        if hasattr(ranks_or_comm, "Get_group"):  # an mpi4py communicator
            self.mpi_comm = ranks_or_comm
            self.ranks = None
        else:
            self.ranks = sorted(int(r) for r in ranks_or_comm)

    def _resolve(self):
        if self.ranks is None:
            from mpi4py import MPI

            group = self.mpi_comm.Get_group()
            world = MPI.COMM_WORLD.Get_group()
            self.ranks = sorted(MPI.Group.Translate_ranks(group, list(range(group.Get_size())), world))
        return self.ranks

    def size(self):
        """Number of ranks in the set (None while not registered)."""
        return None if self.process_set_id is None else len(self.ranks)

    def rank(self):
        """This process's position within the set (None while not registered). A process
        outside the set gets ValueError, as in Horovod (whose engine reports a foreign set)."""
        if self.process_set_id is None:
            return None
        if not self.included():
            raise InvalidArgumentError("Process is not part of provided process set.")
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
        raise ArgumentTypeError(f"process_set must be a ProcessSet, not {type(process_set).__name__}")
    if process_set.process_set_id is None:
        raise UnregisteredProcessSetError(f"{process_set!r} is not registered; call add_process_set() on every rank first")
    return process_set.process_set_id


def process_set_by_id(set_id):
    """The registered ProcessSet with id ``set_id`` (as Horovod's); InvalidArgumentError if none."""
    if set_id == 0:
        return global_process_set
    if set_id not in _registered:
        raise InvalidArgumentError(f"no registered process set has id {set_id}")
    return _registered[set_id]


def set_size(process_set):
    return basics.size() if process_set_id(process_set) == 0 else len(process_set.ranks)


def set_rank(process_set):
    """This rank's position in the set (its global rank for the global set)."""
    return basics.rank() if process_set_id(process_set) == 0 else process_set.ranks.index(basics.rank())


def remember(process_set, set_id):
    """Record that ``process_set`` is registered under ``set_id`` in the running engine."""
    process_set.process_set_id = set_id
    _registered[set_id] = process_set


def forget(process_set):
    """Record that ``process_set`` is no longer registered."""
    _registered.pop(process_set.process_set_id, None)
    process_set.process_set_id = None


def forget_all():
    """The engine stopped: its sets are gone (ids restart with the next init)."""
    for ps in _registered.values():
        ps.process_set_id = None
    _registered.clear()


basics.when_stopped(forget_all)
