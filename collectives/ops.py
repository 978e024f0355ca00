"""The collective verbs on numpy arrays and any CPU array (DLPack or buffer protocol), with
Horovod's names and signatures. Results come back in the caller's type. Arrays in GPU memory
go to collectives.device_ops (NCCL).

Each verb takes a request through its steps in order: its arguments checked and its name
resolved (collectives/arguments.py), the tensor turned into the engine's view of it with its
output and Submission (collectives/requests.py), the submission enqueued
(collectives/submissions.py), and its completion: a Handle (collectives/handles.py), or for the
synchronous verbs the result. A rank whose own input fails a check tells the other ranks
(collectives/shared_failure.py)."""
import numpy as np

from . import arguments, device_ops, requests
from .requests import common_output
from .arrays import engine_dtype
from .constants import Average, OpType
from .device_arrays import on_device as _on_device
from .handles import synchronize
from .process_set_registry import global_process_set, process_set_id
from .shared_failure import announce, failing_together
from . import submissions
from .submissions import allreduce_now, run_now, submit


def _auto_name(kind, process_set=None):
    """``<kind>.noname.<n>``, counted per process set (collectives/arguments.py)."""
    return arguments.auto_name(kind, process_set_id(process_set))


def _name(name, kind, process_set):
    return arguments.name(name, kind, process_set_id(process_set))


_ndarray = np.ndarray


def _one(op, name, process_set, prepare, args, wait=False):
    """One request: ``prepare(*args)`` (collectives/requests.py), the other ranks told if it
    raises, then submitted; a Handle, or with ``wait`` the result."""
    try:  # not failing_together: a generator's context manager costs about a microsecond
        sub, finish, keep_alive = prepare(*args)
    except Exception as error:
        announce(op, [name], process_set, error)
        raise
    return (run_now if wait else submit)([sub], finish, keep_alive)


def _group(op, kind, name, process_set, prepare, tensors, *args):
    """A grouped request's Handle: ``prepare(tensor, member_name, *args, group, size,
    process_set)`` for each tensor, negotiated together under the group's name; the Handle
    resolves to the list of results."""
    group = _name(name, kind, process_set)
    size = len(tensors)
    names = arguments.member_names(group, size)
    with failing_together(op, names, process_set, group, size):
        prepared = [prepare(t, n, *args, group, size, process_set) for n, t in zip(names, tensors)]
    return submit([sub for sub, _, _ in prepared], _members_results, prepared)


def _members_results(outcomes, prepared):
    """A grouped request's results: each member's ``finish`` on its own outcome and objects (the
    common allreduce's output read here: a call per member cost 0.5 us for six)."""
    return [keep[1] if finish is common_output else finish(outcomes[i:i + 1], keep)
            for i, (_, finish, keep) in enumerate(prepared)]


# ---------------------------------------------------------------- allreduce

def _allreduce_start(tensor, op, name, prescale_factor, postscale_factor, process_set, inplace, wait):
    """One host allreduce: a handle, or with ``wait`` the result (no Handle object, the
    synchronous verbs' shortcut). A synchronous call of the common kind goes to the engine in one
    call (submissions.allreduce_now); the others take the steps of ``_one``."""
    # allreduce and allreduce_ tried the one engine call already for a name given as text: here
    # only a generated name's call is left to try it (a declined call would be declined again).
    tried = type(name) is str and name != ""
    name = _name(name, "allreduce", process_set)
    if wait and not tried and type(tensor) is _ndarray and process_set is global_process_set:
        result = allreduce_now(tensor, name, op, prescale_factor, postscale_factor, inplace)
        if result is not None:
            return result
    return _one(OpType.ALLREDUCE, name, process_set, requests.allreduce,
                (tensor, name, op, prescale_factor, postscale_factor, inplace, "", 0, process_set), wait)


def allreduce_async(tensor, op=Average, name=None, prescale_factor=1.0, postscale_factor=1.0,
                    process_set=global_process_set):
    """Start an allreduce; returns a handle for ``poll``/``synchronize``. The input is not modified."""
    if _on_device(tensor):
        return device_ops.allreduce_async(tensor, op, name, prescale_factor, postscale_factor, process_set)
    return _allreduce_start(tensor, op, name, prescale_factor, postscale_factor, process_set, False, False)


def allreduce_async_(tensor, op=Average, name=None, prescale_factor=1.0, postscale_factor=1.0,
                     process_set=global_process_set):
    """In-place ``allreduce_async``: the result is written into ``tensor``."""
    if _on_device(tensor):
        return device_ops.allreduce_async_(tensor, op, name, prescale_factor, postscale_factor, process_set)
    return _allreduce_start(tensor, op, name, prescale_factor, postscale_factor, process_set, True, False)


def allreduce(tensor, op=Average, name=None, prescale_factor=1.0, postscale_factor=1.0,
              process_set=global_process_set):
    """Reduce ``tensor`` over the ranks of ``process_set`` (Average by default) and return the result.
    Ranks that called ``join()`` contribute zeros (and still count in the Average)."""
    if type(tensor) is _ndarray and type(name) is str and name and process_set is global_process_set:
        result = allreduce_now(tensor, name, op, prescale_factor, postscale_factor, False)
        if result is not None:  # the latency case (issue 14), in the fewest Python calls
            return result
    if _on_device(tensor):
        return synchronize(device_ops.allreduce_async(tensor, op, name, prescale_factor, postscale_factor,
                                                      process_set))
    return _allreduce_start(tensor, op, name, prescale_factor, postscale_factor, process_set, False, True)


def allreduce_(tensor, op=Average, name=None, prescale_factor=1.0, postscale_factor=1.0,
               process_set=global_process_set):
    """In-place allreduce; returns ``tensor``."""
    if type(tensor) is _ndarray and type(name) is str and name and process_set is global_process_set:
        result = allreduce_now(tensor, name, op, prescale_factor, postscale_factor, True)
        if result is not None:  # as allreduce
            return result
    if _on_device(tensor):
        return synchronize(device_ops.allreduce_async_(tensor, op, name, prescale_factor, postscale_factor,
                                                       process_set))
    return _allreduce_start(tensor, op, name, prescale_factor, postscale_factor, process_set, True, True)


def _grouped_async(tensors, op, name, prescale_factor, postscale_factor, inplace, process_set):
    """A grouped allreduce's Handle. The synchronous verbs wait on it as it is: making their wait
    run the cycles (as a synchronous allreduce's does) was slower for a group of six arrays
    (benchmarks/grouped_bench.py's sync and async rows, on 2 ranks)."""
    tensors = list(tensors)
    if _on_device(tensors):
        return device_ops.grouped_allreduce_async(tensors, op, name, prescale_factor, postscale_factor, inplace,
                                                  process_set)
    return _group(OpType.ALLREDUCE, "grouped_allreduce", name, process_set, requests.allreduce, tensors, op,
                  prescale_factor, postscale_factor, inplace)


def grouped_allreduce_async(tensors, op=Average, name=None, prescale_factor=1.0, postscale_factor=1.0,
                            process_set=global_process_set):
    """Allreduce a list of tensors negotiated and executed together (fused where they fit)."""
    return _grouped_async(tensors, op, name, prescale_factor, postscale_factor, False, process_set)


def grouped_allreduce_async_(tensors, op=Average, name=None, prescale_factor=1.0, postscale_factor=1.0,
                             process_set=global_process_set):
    return _grouped_async(tensors, op, name, prescale_factor, postscale_factor, True, process_set)


def grouped_allreduce(tensors, op=Average, name=None, prescale_factor=1.0, postscale_factor=1.0,
                      process_set=global_process_set):
    return synchronize(grouped_allreduce_async(tensors, op, name, prescale_factor, postscale_factor, process_set))


def grouped_allreduce_(tensors, op=Average, name=None, prescale_factor=1.0, postscale_factor=1.0,
                       process_set=global_process_set):
    return synchronize(grouped_allreduce_async_(tensors, op, name, prescale_factor, postscale_factor, process_set))


# ---------------------------------------------------------------- broadcast

def broadcast_async(tensor, root_rank, name=None, process_set=global_process_set):
    """Start a broadcast of ``tensor`` from ``root_rank`` (a global rank); the input is not modified."""
    if _on_device(tensor):
        return device_ops.broadcast_async(tensor, root_rank, name, process_set)
    name = _name(name, "broadcast", process_set)
    return _one(OpType.BROADCAST, name, process_set, requests.broadcast, (tensor, name, root_rank, False, process_set))


def broadcast_async_(tensor, root_rank, name=None, process_set=global_process_set):
    """In-place ``broadcast_async``: non-root ranks receive into ``tensor``."""
    if _on_device(tensor):
        return device_ops.broadcast_async_(tensor, root_rank, name, process_set)
    name = _name(name, "broadcast", process_set)
    return _one(OpType.BROADCAST, name, process_set, requests.broadcast, (tensor, name, root_rank, True, process_set))


def broadcast(tensor, root_rank, name=None, process_set=global_process_set):
    """Return root_rank's ``tensor`` on every rank of ``process_set``."""
    return synchronize(broadcast_async(tensor, root_rank, name, process_set))


def broadcast_(tensor, root_rank, name=None, process_set=global_process_set):
    return synchronize(broadcast_async_(tensor, root_rank, name, process_set))


# ---------------------------------------------------------------- allgather

def allgather_async(tensor, name=None, process_set=global_process_set):
    """Start an allgather: concatenation over ranks along the first dimension, which may differ."""
    if _on_device(tensor):
        return device_ops.allgather_async(tensor, name, process_set)
    name = _name(name, "allgather", process_set)
    return _one(OpType.ALLGATHER, name, process_set, requests.allgather, (tensor, name, "", 0, process_set))


def allgather(tensor, name=None, process_set=global_process_set):
    return synchronize(allgather_async(tensor, name, process_set))


def grouped_allgather_async(tensors, name=None, process_set=global_process_set):
    """Allgather each tensor of a list, negotiated together; the handle resolves to the list."""
    tensors = list(tensors)
    if _on_device(tensors):
        return device_ops.grouped_allgather_async(tensors, name, process_set)
    return _group(OpType.ALLGATHER, "grouped_allgather", name, process_set, requests.allgather, tensors)


def grouped_allgather(tensors, name=None, process_set=global_process_set):
    """Allgather each tensor of a list; returns the list of results."""
    return synchronize(grouped_allgather_async(tensors, name, process_set))


# ---------------------------------------------------------------- alltoall

def alltoall_async(tensor, splits=None, name=None, process_set=global_process_set):
    """Start an alltoall: rows ``splits[i]`` of the first dimension go to the set's i-th rank
    (equal parts when ``splits`` is None)."""
    if _on_device(tensor):
        return device_ops.alltoall_async(tensor, splits, name, process_set)
    name = _name(name, "alltoall", process_set)
    return _one(OpType.ALLTOALL, name, process_set, requests.alltoall, (tensor, name, splits, process_set))


def alltoall(tensor, splits=None, name=None, process_set=global_process_set):
    """Returns the received tensor; with ``splits``, ``(received, received_splits)`` as Horovod."""
    received, received_splits = synchronize(alltoall_async(tensor, splits, name, process_set))
    return received if splits is None else (received, received_splits)


# ---------------------------------------------------------------- reducescatter

def reducescatter_async(tensor, op=Average, name=None, prescale_factor=1.0, postscale_factor=1.0,
                        process_set=global_process_set):
    """Start a reducescatter: reduce over the set's ranks, its i-th rank keeps the i-th block
    of rows (the first ``dim0 % n`` ranks get one extra row)."""
    if _on_device(tensor):
        return device_ops.reducescatter_async(tensor, op, name, prescale_factor, postscale_factor, process_set)
    name = _name(name, "reducescatter", process_set)
    return _one(OpType.REDUCESCATTER, name, process_set, requests.reducescatter,
                (tensor, name, op, prescale_factor, postscale_factor, "", 0, process_set))


def reducescatter(tensor, op=Average, name=None, prescale_factor=1.0, postscale_factor=1.0,
                  process_set=global_process_set):
    return synchronize(reducescatter_async(tensor, op, name, prescale_factor, postscale_factor, process_set))


def grouped_reducescatter_async(tensors, op=Average, name=None, prescale_factor=1.0, postscale_factor=1.0,
                                process_set=global_process_set):
    """Reducescatter each tensor of a list, negotiated together; the handle resolves to the list."""
    tensors = list(tensors)
    if _on_device(tensors):
        return device_ops.grouped_reducescatter_async(tensors, op, name, prescale_factor, postscale_factor,
                                                      process_set)
    return _group(OpType.REDUCESCATTER, "grouped_reducescatter", name, process_set, requests.reducescatter, tensors,
                  op, prescale_factor, postscale_factor)


def grouped_reducescatter(tensors, op=Average, name=None, prescale_factor=1.0, postscale_factor=1.0,
                          process_set=global_process_set):
    return synchronize(grouped_reducescatter_async(tensors, op, name, prescale_factor, postscale_factor,
                                                   process_set))


# ---------------------------------------------------------------- barrier, join, control

def barrier(name=None, process_set=global_process_set):
    """Block until every rank of ``process_set`` has called barrier."""
    name = _name(name, "barrier", process_set)
    empty = np.empty(0, dtype=np.uint8)
    sub = submissions.submission(int(OpType.BARRIER), name, input=empty, dtype=int(engine_dtype(empty.dtype)),
                                 process_set=process_set_id(process_set))
    synchronize(submit([sub], lambda *_: None, None))


def join(device=-1):
    """Declare that this rank has no more data (Horovod's ``hvd.join``). Blocks until every
    rank has joined; meanwhile this rank contributes zeros to the other ranks' allreduces
    (broadcast, allgather, alltoall and reducescatter fail while a rank is joined). Returns
    the rank that joined last. ``device`` is accepted for Horovod compatibility."""
    return control_request(OpType.JOIN, _auto_name("join"))


def control_request(op, name, splits=(), root=0):
    """Submit a control operation (join, process-set changes) and wait; returns its value."""
    sub = submissions.submission(int(op), name, reduce_op=0, root=int(root), splits=[int(s) for s in splits])
    return synchronize(submit([sub], lambda outcomes, _: int(outcomes[0][5]), None))
