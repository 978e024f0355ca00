"""The collective verbs on numpy arrays and any CPU array (DLPack or buffer protocol), with
Horovod's names and signatures. Results come back in the caller's type. Arrays in GPU memory
go to collectives.device_ops (NCCL)."""
import numbers

import numpy as np

from . import allreduce_fast, arguments, device_ops
from .arrays import Converted, aligned_empty, engine_dtype, from_engine_buffer
from .device_arrays import on_device as _on_device
from .constants import Average, OpType, ReduceOp
from .errors import InvalidArgumentError
from .handles import allreduce_now, run_now, submit, synchronize
from .process_set_registry import global_process_set, process_set_id, set_rank, set_size
from .shared_failure import announce, failing_together


def _auto_name(kind, process_set=None):
    """``<kind>.noname.<n>``, counted per process set (collectives/arguments.py)."""
    return arguments.auto_name(kind, process_set_id(process_set))


def _name(name, kind, process_set):
    return arguments.name(name, kind, process_set_id(process_set))


_reduce_op = arguments.reduce_op
_ndarray = np.ndarray


def _spec(op, name, arr, out, reduce_op=ReduceOp.SUM, root=0, prescale=1.0, postscale=1.0, splits=(), group="",
          group_size=0, process_set=None):
    # The engine takes pointer and shape from the arrays themselves (see csrc/python/bindings.cc).
    dtype = engine_dtype(arr.dtype) if arr is not None else 0
    return (int(op), name, arr, out, int(dtype), int(reduce_op), arguments.root_rank(root),
            arguments.scale_factor(prescale, "prescale_factor"), arguments.scale_factor(postscale, "postscale_factor"),
            list(splits), group, int(group_size), process_set_id(process_set))


def _inplace_target(conv, what):
    """Where an in-place op writes: the user's memory, or a contiguous copy written back."""
    if isinstance(conv.original, (np.generic, numbers.Number)):
        raise InvalidArgumentError(f"{what} cannot modify a {type(conv.original).__name__} in place: Python and "
                                   "numpy scalars are immutable (use the verb without '_' and its result)")
    if not conv.view.flags.writeable:
        raise InvalidArgumentError(f"{what} needs a writable array")
    return conv.array if conv.array is conv.view else conv.array.copy()


def _write_back(conv, out):
    if out is not conv.view:
        conv.view[...] = out
    return conv.original


# ---------------------------------------------------------------- allreduce

def _allreduce_prepare(tensor, op, name, prescale_factor, postscale_factor, inplace, group="", group_size=0,
                       process_set=None):
    conv = Converted(tensor)
    out = _inplace_target(conv, "allreduce_") if inplace else aligned_empty(conv.array.shape, conv.array.dtype)
    src = out if inplace else conv.array
    spec = _spec(OpType.ALLREDUCE, name, src, out, _reduce_op(op), 0, prescale_factor, postscale_factor,
                 group=group, group_size=group_size, process_set=process_set)
    return conv, out, spec


def _allreduce_start(tensor, op, name, prescale_factor, postscale_factor, process_set, inplace, wait):
    """Submit one host allreduce: a handle, or with ``wait`` the result (no Handle object, the
    synchronous verbs' shortcut). The common call skips the general argument handling: a
    synchronous one goes to the engine in one call (handles.allreduce_now), an asynchronous one
    builds its submission with type tests (collectives/allreduce_fast.py)."""
    # allreduce and allreduce_ tried the one engine call already for a name given as text: here
    # only a generated name's call is left to try it (a declined call would be declined again).
    tried = type(name) is str and name != ""
    name = _name(name, "allreduce", process_set)
    if wait and not tried and type(tensor) is _ndarray and process_set is global_process_set:
        result = allreduce_now(tensor, name, op, prescale_factor, postscale_factor, inplace)
        if result is not None:
            return result
    try:
        fast = allreduce_fast.spec_or_none(tensor, op, name, prescale_factor, postscale_factor, process_set, inplace)
    except Exception as error:  # e.g. MemoryError for the output: the other ranks must not wait
        announce(OpType.ALLREDUCE, [name], process_set, error)
        raise
    if fast is not None:
        spec, out = fast
        finish, keep_alive = (lambda _: out), (tensor, out)
    else:
        with failing_together(OpType.ALLREDUCE, [name], process_set):
            conv, out, spec = _allreduce_prepare(tensor, op, name, prescale_factor, postscale_factor, inplace,
                                                 process_set=process_set)
        if inplace:
            finish = lambda _: _write_back(conv, out)  # noqa: E731
        else:
            finish = lambda _: conv.wrap(out)  # noqa: E731
        keep_alive = (conv, out)
    return (run_now if wait else submit)([spec], finish, keep_alive)


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


def _grouped_member(tensor, op, name, prescale_factor, postscale_factor, inplace, group, group_size, process_set):
    """(conv or None, out, spec) of one tensor of a group: the common call through
    allreduce_fast's type tests (conv None: ``out`` is the result), anything else through the
    general checks."""
    fast = allreduce_fast.spec_or_none(tensor, op, name, prescale_factor, postscale_factor, process_set, inplace,
                                       group, group_size)
    if fast is not None:
        spec, out = fast
        return None, out, spec
    return _allreduce_prepare(tensor, op, name, prescale_factor, postscale_factor, inplace, group, group_size,
                              process_set)


def _grouped_async(tensors, op, name, prescale_factor, postscale_factor, inplace, process_set):
    """A grouped allreduce's Handle. The synchronous verbs wait on it as it is: making their wait
    run the cycles (as a synchronous allreduce's does) was slower for a group of six arrays
    (benchmarks/grouped_bench.py's sync and async rows, on 2 ranks)."""
    tensors = list(tensors)
    if _on_device(tensors):
        return device_ops.grouped_allreduce_async(tensors, op, name, prescale_factor, postscale_factor, inplace,
                                                  process_set)
    group = _name(name, "grouped_allreduce", process_set)
    size = len(tensors)
    names = arguments.member_names(group, size)
    with failing_together(OpType.ALLREDUCE, names, process_set, group, size):
        prepared = [_grouped_member(t, op, n, prescale_factor, postscale_factor, inplace, group, size, process_set)
                    for n, t in zip(names, tensors)]
    if inplace:
        finish = lambda _: [out if conv is None else _write_back(conv, out) for conv, out, _ in prepared]  # noqa: E731
    else:
        finish = lambda _: [out if conv is None else conv.wrap(out) for conv, out, _ in prepared]  # noqa: E731
    return submit([spec for _, _, spec in prepared], finish, prepared)


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
    with failing_together(OpType.BROADCAST, [name], process_set):
        conv = Converted(tensor)
        out = aligned_empty(conv.array.shape, conv.array.dtype)
        spec = _spec(OpType.BROADCAST, name, conv.array, out, root=root_rank, process_set=process_set)
    return submit([spec], lambda _: conv.wrap(out), (conv, out))


def broadcast_async_(tensor, root_rank, name=None, process_set=global_process_set):
    """In-place ``broadcast_async``: non-root ranks receive into ``tensor``."""
    if _on_device(tensor):
        return device_ops.broadcast_async_(tensor, root_rank, name, process_set)
    name = _name(name, "broadcast", process_set)
    with failing_together(OpType.BROADCAST, [name], process_set):
        conv = Converted(tensor)
        out = _inplace_target(conv, "broadcast_")
        spec = _spec(OpType.BROADCAST, name, out, out, root=root_rank, process_set=process_set)
    return submit([spec], lambda _: _write_back(conv, out), (conv, out))


def broadcast(tensor, root_rank, name=None, process_set=global_process_set):
    """Return root_rank's ``tensor`` on every rank of ``process_set``."""
    return synchronize(broadcast_async(tensor, root_rank, name, process_set))


def broadcast_(tensor, root_rank, name=None, process_set=global_process_set):
    return synchronize(broadcast_async_(tensor, root_rank, name, process_set))


# ---------------------------------------------------------------- allgather

def _allgather_prepare(tensor, name, group="", group_size=0, process_set=None):
    conv = Converted(tensor)
    arr = conv.array if conv.array.ndim > 0 else conv.array.reshape(1)
    spec = _spec(OpType.ALLGATHER, name, arr, None, group=group, group_size=group_size, process_set=process_set)

    def finish(outcome):
        buffer, shape = outcome[2], outcome[3]
        return conv.wrap(from_engine_buffer(buffer, shape, arr.dtype))

    return (conv, arr), spec, finish


def allgather_async(tensor, name=None, process_set=global_process_set):
    """Start an allgather: concatenation over ranks along the first dimension, which may differ."""
    if _on_device(tensor):
        return device_ops.allgather_async(tensor, name, process_set)
    name = _name(name, "allgather", process_set)
    with failing_together(OpType.ALLGATHER, [name], process_set):
        keep, spec, finish = _allgather_prepare(tensor, name, process_set=process_set)
    return submit([spec], lambda outcomes: finish(outcomes[0]), keep)


def allgather(tensor, name=None, process_set=global_process_set):
    return synchronize(allgather_async(tensor, name, process_set))


def grouped_allgather_async(tensors, name=None, process_set=global_process_set):
    """Allgather each tensor of a list, negotiated together; the handle resolves to the list."""
    tensors = list(tensors)
    if _on_device(tensors):
        return device_ops.grouped_allgather_async(tensors, name, process_set)
    group = _name(name, "grouped_allgather", process_set)
    names = arguments.member_names(group, len(tensors))
    with failing_together(OpType.ALLGATHER, names, process_set, group, len(tensors)):
        prepared = [_allgather_prepare(t, n, group, len(tensors), process_set) for n, t in zip(names, tensors)]
    finish = lambda outcomes: [f(o) for (_, _, f), o in zip(prepared, outcomes)]  # noqa: E731
    return submit([spec for _, spec, _ in prepared], finish, [keep for keep, _, _ in prepared])


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
    with failing_together(OpType.ALLTOALL, [name], process_set):
        conv = Converted(tensor)
        spec = _spec(OpType.ALLTOALL, name, conv.array, None, splits=arguments.splits(splits), process_set=process_set)

    def finish(outcomes):
        # Always both, as Horovod's handles: alltoall() drops the splits when none were given.
        buffer, shape, received = outcomes[0][2:5]
        output = conv.wrap(from_engine_buffer(buffer, shape, conv.array.dtype))
        return output, conv.wrap_index(np.asarray(received, dtype=np.int32))

    return submit([spec], finish, conv)


def alltoall(tensor, splits=None, name=None, process_set=global_process_set):
    """Returns the received tensor; with ``splits``, ``(received, received_splits)`` as Horovod."""
    received, received_splits = synchronize(alltoall_async(tensor, splits, name, process_set))
    return received if splits is None else (received, received_splits)


# ---------------------------------------------------------------- reducescatter

def _reducescatter_prepare(tensor, op, name, prescale_factor, postscale_factor, group="", group_size=0,
                           process_set=None):
    conv = Converted(tensor)
    arr = conv.array
    if arr.ndim == 0:
        raise InvalidArgumentError(f"reducescatter needs a tensor with at least one dimension (tensor '{name}')")
    n, r = set_size(process_set), set_rank(process_set)
    rows = arr.shape[0] // n + (1 if r < arr.shape[0] % n else 0)
    out = aligned_empty((rows,) + arr.shape[1:], arr.dtype)
    spec = _spec(OpType.REDUCESCATTER, name, arr, out, _reduce_op(op), 0, prescale_factor, postscale_factor,
                 group=group, group_size=group_size, process_set=process_set)
    return conv, out, spec


def reducescatter_async(tensor, op=Average, name=None, prescale_factor=1.0, postscale_factor=1.0,
                        process_set=global_process_set):
    """Start a reducescatter: reduce over the set's ranks, its i-th rank keeps the i-th block
    of rows (the first ``dim0 % n`` ranks get one extra row)."""
    if _on_device(tensor):
        return device_ops.reducescatter_async(tensor, op, name, prescale_factor, postscale_factor, process_set)
    name = _name(name, "reducescatter", process_set)
    with failing_together(OpType.REDUCESCATTER, [name], process_set):
        conv, out, spec = _reducescatter_prepare(tensor, op, name, prescale_factor, postscale_factor,
                                                 process_set=process_set)
    return submit([spec], lambda _: conv.wrap(out), (conv, out))


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
    group = _name(name, "grouped_reducescatter", process_set)
    names = arguments.member_names(group, len(tensors))
    with failing_together(OpType.REDUCESCATTER, names, process_set, group, len(tensors)):
        prepared = [_reducescatter_prepare(t, op, n, prescale_factor, postscale_factor, group, len(tensors),
                                           process_set)
                    for n, t in zip(names, tensors)]
    finish = lambda _: [conv.wrap(out) for conv, out, _ in prepared]  # noqa: E731
    return submit([spec for _, _, spec in prepared], finish, prepared)


def grouped_reducescatter(tensors, op=Average, name=None, prescale_factor=1.0, postscale_factor=1.0,
                          process_set=global_process_set):
    return synchronize(grouped_reducescatter_async(tensors, op, name, prescale_factor, postscale_factor,
                                                   process_set))


# ---------------------------------------------------------------- barrier, join, control

def barrier(name=None, process_set=global_process_set):
    """Block until every rank of ``process_set`` has called barrier."""
    name = _name(name, "barrier", process_set)
    empty = np.empty(0, dtype=np.uint8)
    spec = _spec(OpType.BARRIER, name, empty, None, process_set=process_set)
    synchronize(submit([spec], lambda _: None, None))


def join(device=-1):
    """Declare that this rank has no more data (Horovod's ``hvd.join``). Blocks until every
    rank has joined; meanwhile this rank contributes zeros to the other ranks' allreduces
    (broadcast, allgather, alltoall and reducescatter fail while a rank is joined). Returns
    the rank that joined last. ``device`` is accepted for Horovod compatibility."""
    return control_request(OpType.JOIN, _auto_name("join"))


def control_request(op, name, splits=(), root=0):
    """Submit a control operation (join, process-set changes) and wait; returns its value."""
    spec = (int(op), name, None, None, 0, 0, int(root), 1.0, 1.0, [int(s) for s in splits], "", 0, 0)
    return synchronize(submit([spec], lambda outcomes: int(outcomes[0][5]), None))
