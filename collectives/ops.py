"""The collective verbs on numpy arrays and any CPU array (DLPack or buffer protocol), with
Horovod's names and signatures. Results come back in the caller's type."""
import itertools
import threading

import numpy as np

from . import basics
from .arrays import Converted, aligned_empty, engine_dtype, from_engine_buffer
from .constants import Average, OpType, ReduceOp
from .errors import InvalidArgumentError
from .handles import submit, synchronize

_name_lock = threading.Lock()
_counters = {}


def _auto_name(kind):
    # Unnamed calls get "<kind>.noname.<n>": the same on every rank as long as the ranks
    # make their unnamed calls in the same order (Horovod's contract).
    with _name_lock:
        counter = _counters.setdefault(kind, itertools.count())
        return f"{kind}.noname.{next(counter)}"


def _reduce_op(op):
    if op is None:
        return Average
    try:
        return ReduceOp(int(op))
    except ValueError:
        raise InvalidArgumentError(f"unknown reduction op {op!r}") from None


def _spec(op, name, arr, out, reduce_op=ReduceOp.SUM, root=0, prescale=1.0, postscale=1.0, splits=(), group="",
          group_size=0):
    # The engine takes pointer and shape from the arrays themselves (see csrc/bindings.cc).
    return (int(op), name, arr, out, int(engine_dtype(arr.dtype)), int(reduce_op), int(root), float(prescale),
            float(postscale), [int(s) for s in splits], group, int(group_size))


def _inplace_target(conv, what):
    """Where an in-place op writes: the user's memory, or a contiguous copy written back."""
    if not conv.view.flags.writeable:
        raise InvalidArgumentError(f"{what} needs a writable array")
    return conv.array if conv.array is conv.view else conv.array.copy()


def _write_back(conv, out):
    if out is not conv.view:
        conv.view[...] = out
    return conv.original


# ---------------------------------------------------------------- allreduce

def _allreduce_prepare(tensor, op, name, prescale_factor, postscale_factor, inplace, group="", group_size=0):
    conv = Converted(tensor)
    out = _inplace_target(conv, "allreduce_") if inplace else aligned_empty(conv.array.shape, conv.array.dtype)
    src = out if inplace else conv.array
    spec = _spec(OpType.ALLREDUCE, name, src, out, _reduce_op(op), 0, prescale_factor, postscale_factor,
                 group=group, group_size=group_size)
    return conv, out, spec


def allreduce_async(tensor, op=Average, name=None, prescale_factor=1.0, postscale_factor=1.0):
    """Start an allreduce; returns a handle for ``poll``/``synchronize``. The input is not modified."""
    name = name or _auto_name("allreduce")
    conv, out, spec = _allreduce_prepare(tensor, op, name, prescale_factor, postscale_factor, False)
    return submit([spec], lambda _: conv.wrap(out), (conv, out))


def allreduce_async_(tensor, op=Average, name=None, prescale_factor=1.0, postscale_factor=1.0):
    """In-place ``allreduce_async``: the result is written into ``tensor``."""
    name = name or _auto_name("allreduce")
    conv, out, spec = _allreduce_prepare(tensor, op, name, prescale_factor, postscale_factor, True)
    return submit([spec], lambda _: _write_back(conv, out), (conv, out))


def allreduce(tensor, op=Average, name=None, prescale_factor=1.0, postscale_factor=1.0):
    """Reduce ``tensor`` over all ranks (Average by default) and return the result."""
    return synchronize(allreduce_async(tensor, op, name, prescale_factor, postscale_factor))


def allreduce_(tensor, op=Average, name=None, prescale_factor=1.0, postscale_factor=1.0):
    """In-place allreduce; returns ``tensor``."""
    return synchronize(allreduce_async_(tensor, op, name, prescale_factor, postscale_factor))


def _grouped_async(tensors, op, name, prescale_factor, postscale_factor, inplace):
    tensors = list(tensors)
    group = name or _auto_name("grouped_allreduce")
    prepared = [
        _allreduce_prepare(t, op, f"{group}.{i}", prescale_factor, postscale_factor, inplace, group, len(tensors))
        for i, t in enumerate(tensors)
    ]
    if inplace:
        finish = lambda _: [_write_back(conv, out) for conv, out, _ in prepared]  # noqa: E731
    else:
        finish = lambda _: [conv.wrap(out) for conv, out, _ in prepared]  # noqa: E731
    return submit([spec for _, _, spec in prepared], finish, prepared)


def grouped_allreduce_async(tensors, op=Average, name=None, prescale_factor=1.0, postscale_factor=1.0):
    """Allreduce a list of tensors negotiated and executed together (fused where they fit)."""
    return _grouped_async(tensors, op, name, prescale_factor, postscale_factor, False)


def grouped_allreduce_async_(tensors, op=Average, name=None, prescale_factor=1.0, postscale_factor=1.0):
    return _grouped_async(tensors, op, name, prescale_factor, postscale_factor, True)


def grouped_allreduce(tensors, op=Average, name=None, prescale_factor=1.0, postscale_factor=1.0):
    return synchronize(grouped_allreduce_async(tensors, op, name, prescale_factor, postscale_factor))


def grouped_allreduce_(tensors, op=Average, name=None, prescale_factor=1.0, postscale_factor=1.0):
    return synchronize(grouped_allreduce_async_(tensors, op, name, prescale_factor, postscale_factor))


# ---------------------------------------------------------------- broadcast

def broadcast_async(tensor, root_rank, name=None):
    """Start a broadcast of ``tensor`` from ``root_rank``; the input is not modified."""
    name = name or _auto_name("broadcast")
    conv = Converted(tensor)
    out = aligned_empty(conv.array.shape, conv.array.dtype)
    spec = _spec(OpType.BROADCAST, name, conv.array, out, root=root_rank)
    return submit([spec], lambda _: conv.wrap(out), (conv, out))


def broadcast_async_(tensor, root_rank, name=None):
    """In-place ``broadcast_async``: non-root ranks receive into ``tensor``."""
    name = name or _auto_name("broadcast")
    conv = Converted(tensor)
    out = _inplace_target(conv, "broadcast_")
    spec = _spec(OpType.BROADCAST, name, out, out, root=root_rank)
    return submit([spec], lambda _: _write_back(conv, out), (conv, out))


def broadcast(tensor, root_rank, name=None):
    """Return root_rank's ``tensor`` on every rank."""
    return synchronize(broadcast_async(tensor, root_rank, name))


def broadcast_(tensor, root_rank, name=None):
    return synchronize(broadcast_async_(tensor, root_rank, name))


# ---------------------------------------------------------------- allgather

def allgather_async(tensor, name=None):
    """Start an allgather: concatenation over ranks along the first dimension, which may differ."""
    name = name or _auto_name("allgather")
    conv = Converted(tensor)
    arr = conv.array if conv.array.ndim > 0 else conv.array.reshape(1)
    spec = _spec(OpType.ALLGATHER, name, arr, None)

    def finish(outcomes):
        _, _, buffer, shape, _ = outcomes[0]
        return conv.wrap(from_engine_buffer(buffer, shape, arr.dtype))

    return submit([spec], finish, (conv, arr))


def allgather(tensor, name=None):
    return synchronize(allgather_async(tensor, name))


def grouped_allgather(tensors, name=None):
    """Allgather each tensor of a list; returns the list of results."""
    base = name or _auto_name("grouped_allgather")
    handles = [allgather_async(t, f"{base}.{i}") for i, t in enumerate(tensors)]
    return [synchronize(h) for h in handles]


# ---------------------------------------------------------------- alltoall

def alltoall_async(tensor, splits=None, name=None):
    """Start an alltoall: rows ``splits[i]`` of the first dimension go to rank i (equal parts
    when ``splits`` is None)."""
    name = name or _auto_name("alltoall")
    conv = Converted(tensor)
    split_list = [] if splits is None else [int(s) for s in np.asarray(splits).reshape(-1)]
    spec = _spec(OpType.ALLTOALL, name, conv.array, None, splits=split_list)

    def finish(outcomes):
        _, _, buffer, shape, received = outcomes[0]
        output = conv.wrap(from_engine_buffer(buffer, shape, conv.array.dtype))
        if splits is None:
            return output
        return output, conv.wrap_index(np.asarray(received, dtype=np.int32))

    return submit([spec], finish, conv)


def alltoall(tensor, splits=None, name=None):
    """Returns the received tensor; with ``splits``, ``(received, received_splits)`` as Horovod."""
    return synchronize(alltoall_async(tensor, splits, name))


# ---------------------------------------------------------------- reducescatter

def reducescatter_async(tensor, op=Average, name=None, prescale_factor=1.0, postscale_factor=1.0):
    """Start a reducescatter: reduce over ranks, rank i keeps the i-th block of rows (the
    first ``dim0 % size`` ranks get one extra row)."""
    name = name or _auto_name("reducescatter")
    conv = Converted(tensor)
    arr = conv.array
    if arr.ndim == 0:
        raise InvalidArgumentError("reducescatter needs a tensor with at least one dimension")
    n, r = basics.size(), basics.rank()
    rows = arr.shape[0] // n + (1 if r < arr.shape[0] % n else 0)
    out = aligned_empty((rows,) + arr.shape[1:], arr.dtype)
    spec = _spec(OpType.REDUCESCATTER, name, arr, out, _reduce_op(op), 0, prescale_factor, postscale_factor)
    return submit([spec], lambda _: conv.wrap(out), (conv, out))


def reducescatter(tensor, op=Average, name=None, prescale_factor=1.0, postscale_factor=1.0):
    return synchronize(reducescatter_async(tensor, op, name, prescale_factor, postscale_factor))


def grouped_reducescatter(tensors, op=Average, name=None, prescale_factor=1.0, postscale_factor=1.0):
    base = name or _auto_name("grouped_reducescatter")
    handles = [reducescatter_async(t, op, f"{base}.{i}", prescale_factor, postscale_factor)
               for i, t in enumerate(tensors)]
    return [synchronize(h) for h in handles]


# ---------------------------------------------------------------- barrier

def barrier(name=None):
    """Block until every rank has called barrier."""
    name = name or _auto_name("barrier")
    empty = np.empty(0, dtype=np.uint8)
    synchronize(submit([_spec(OpType.BARRIER, name, empty, None)], lambda _: None, None))
