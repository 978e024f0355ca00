"""Process sets for the TensorFlow face: Horovod's ``ProcessSet``, ``global_process_set``,
``add_process_set`` and ``remove_process_set`` are the core's; this module adds what the
TensorFlow verbs need on top (the keyword for the core, size and rank within a set)."""
from collectives.process_sets import (  # noqa: F401 - re-exported by the faces
    ProcessSet,
    add_process_set,
    global_process_set,
    process_set_id,
    remove_process_set,
)
from collectives.process_sets import set_rank as _core_set_rank
from collectives.process_sets import set_size as _core_set_size


def core_kwargs(process_set):
    """Keyword arguments for the core's verbs; rejects an unregistered or foreign set now
    (at call or trace time) rather than when the hop runs."""
    process_set_id(process_set)
    return {"process_set": global_process_set if process_set is None else process_set}


def set_size(process_set):
    return _core_set_size(process_set)


def set_rank(process_set):
    """This rank's position in the set (its global rank for the global set)."""
    return _core_set_rank(process_set)


def included(process_set):
    return process_set_id(process_set) == 0 or bool(process_set.included())
