"""The collective verbs on tf.Tensors, without gradients: each is one hop (adapters.tensorflow.hops)
running the core's verbs (``collectives.ops``) on numpy views of the tensors.

Arguments here are already normalized (an explicit reduce op, a process set or None); the
Horovod signatures live in ``mpi_ops``, the gradients in ``functions``.
"""
import numpy as np
import tensorflow as tf

from collectives import ops as core
from collectives.handles import synchronize

from .hops import run_hop
from .naming import digest
from .process_sets import core_kwargs, set_rank, set_size
from .tensors import as_tensor, from_wire, to_wire


def _same_shapes(tensors):
    return [t.shape for t in tensors]


def _gathered_shape(shape):
    """Static shape of an allgather/alltoall result: unknown first dimension."""
    if shape.rank is None:
        return tf.TensorShape(None)
    if shape.rank == 0:
        return tf.TensorShape([None])
    return tf.TensorShape([None]).concatenate(shape[1:])


# ---------------------------------------------------------------- allreduce

def grouped_allreduce(tensors, op, name=None, prescale_factor=1.0, postscale_factor=1.0, process_set=None):
    """Reduce every tensor of the list over the ranks: one hop, one grouped engine request."""
    tensors = [as_tensor(t, "grouped_allreduce") for t in tensors]
    if not tensors:
        return []
    kw = core_kwargs(process_set)

    def reduce_arrays(arrays):
        return core.grouped_allreduce(arrays, op=op, name=name, prescale_factor=prescale_factor,
                                             postscale_factor=postscale_factor, **kw)

    return run_hop(reduce_arrays, tensors, [t.dtype for t in tensors], "grouped_allreduce", _same_shapes(tensors))


def allreduce(tensor, op, name=None, prescale_factor=1.0, postscale_factor=1.0, process_set=None):
    tensor = as_tensor(tensor, "allreduce")
    kw = core_kwargs(process_set)

    def reduce_array(arrays):
        return [core.allreduce(arrays[0], op=op, name=name, prescale_factor=prescale_factor,
                                      postscale_factor=postscale_factor, **kw)]

    return run_hop(reduce_array, [tensor], [tensor.dtype], "allreduce", [tensor.shape])[0]


# ---------------------------------------------------------------- broadcast

def broadcast(tensor, root_rank, name=None, process_set=None):
    tensor = as_tensor(tensor, "broadcast", moves_bytes=True)
    wire = to_wire(tensor)
    kw = core_kwargs(process_set)

    def broadcast_array(arrays):
        return [core.broadcast(arrays[0], root_rank, name=name, **kw)]

    out = run_hop(broadcast_array, [wire], [wire.dtype], "broadcast", [tensor.shape])[0]
    return from_wire(out, tensor.dtype)


def grouped_broadcast(tensors, root_rank, prefix, process_set=None):
    """Broadcast every tensor of the list in one hop, under the engine names
    ``<prefix>.<digest of dtypes and shapes>.<i>`` (the same on every rank)."""
    tensors = [as_tensor(t, "broadcast", moves_bytes=True) for t in tensors]
    if not tensors:
        return []
    wire = [to_wire(t) for t in tensors]
    kw = core_kwargs(process_set)

    def broadcast_arrays(arrays):
        base = f"{prefix}.{digest(arrays)}"
        handles = [core.broadcast_async(a, root_rank, name=f"{base}.{i}", **kw) for i, a in enumerate(arrays)]
        return [synchronize(h) for h in handles]

    out = run_hop(broadcast_arrays, wire, [t.dtype for t in wire], "broadcast", _same_shapes(wire))
    return [from_wire(o, t.dtype) for o, t in zip(out, tensors)]


# ---------------------------------------------------------------- allgather

def allgather(tensor, name=None, process_set=None):
    tensor = as_tensor(tensor, "allgather", moves_bytes=True)
    wire = to_wire(tensor)
    kw = core_kwargs(process_set)

    def gather_array(arrays):
        return [core.allgather(arrays[0], name=name, **kw)]

    out = run_hop(gather_array, [wire], [wire.dtype], "allgather", [_gathered_shape(tensor.shape)])[0]
    return from_wire(out, tensor.dtype)


def grouped_allgather(tensors, name=None, process_set=None):
    tensors = [as_tensor(t, "grouped_allgather", moves_bytes=True) for t in tensors]
    if not tensors:
        return []
    wire = [to_wire(t) for t in tensors]
    kw = core_kwargs(process_set)

    def gather_arrays(arrays):
        return core.grouped_allgather(arrays, name=name, **kw)

    out = run_hop(gather_arrays, wire, [t.dtype for t in wire], "grouped_allgather",
                  [_gathered_shape(t.shape) for t in tensors])
    return [from_wire(o, t.dtype) for o, t in zip(out, tensors)]


# ---------------------------------------------------------------- alltoall

def alltoall(tensor, splits=None, name=None, process_set=None):
    """Returns ``(received, received_splits)``; received_splits is an int32 tensor."""
    tensor = as_tensor(tensor, "alltoall", moves_bytes=True)
    kw = core_kwargs(process_set)
    n = set_size(process_set)
    inputs = [to_wire(tensor)]
    if splits is not None:
        # Uncast: the core refuses non-integer splits (collectives/arguments.py) inside its
        # shared-failure guard, so one rank's float splits fail every rank instead of becoming counts.
        inputs.append(tf.reshape(tf.convert_to_tensor(splits), [-1]))

    def alltoall_array(arrays):
        arr = arrays[0]
        if len(arrays) > 1:
            split_list = arrays[1]
        else:  # equal parts, made explicit so the received splits are always known (for the gradient)
            dim0 = arr.shape[0] if arr.ndim else 0
            split_list = None if dim0 % n else [dim0 // n] * n
        result = core.alltoall(arr, split_list, name=name, **kw)
        if split_list is None:  # the core raises before this for indivisible inputs
            return [result, np.zeros(n, np.int32)]
        received, received_splits = result
        return [received, np.asarray(received_splits, dtype=np.int32)]

    out, received_splits = run_hop(alltoall_array, inputs, [inputs[0].dtype, tf.int32], "alltoall",
                                   [_gathered_shape(tensor.shape), tf.TensorShape([n])])
    return from_wire(out, tensor.dtype), received_splits


# ---------------------------------------------------------------- reducescatter

def _scattered_shape(shape, process_set):
    if shape.rank is None or shape.rank == 0 or shape[0] is None:
        return tf.TensorShape(None) if shape.rank is None else tf.TensorShape([None]).concatenate(shape[1:])
    n, r = set_size(process_set), set_rank(process_set)
    rows = shape[0] // n + (1 if r < shape[0] % n else 0)
    return tf.TensorShape([rows]).concatenate(shape[1:])


def reducescatter(tensor, op, name=None, prescale_factor=1.0, postscale_factor=1.0, process_set=None):
    tensor = as_tensor(tensor, "reducescatter")
    kw = core_kwargs(process_set)

    def scatter_array(arrays):
        return [core.reducescatter(arrays[0], op=op, name=name, prescale_factor=prescale_factor,
                                          postscale_factor=postscale_factor, **kw)]

    return run_hop(scatter_array, [tensor], [tensor.dtype], "reducescatter",
                   [_scattered_shape(tensor.shape, process_set)])[0]


def grouped_reducescatter(tensors, op, name=None, prescale_factor=1.0, postscale_factor=1.0, process_set=None):
    tensors = [as_tensor(t, "grouped_reducescatter") for t in tensors]
    if not tensors:
        return []
    kw = core_kwargs(process_set)

    def scatter_arrays(arrays):
        return core.grouped_reducescatter(arrays, op=op, name=name, prescale_factor=prescale_factor,
                                                 postscale_factor=postscale_factor, **kw)

    return run_hop(scatter_arrays, tensors, [t.dtype for t in tensors], "grouped_reducescatter",
                   [_scattered_shape(t.shape, process_set) for t in tensors])


# ---------------------------------------------------------------- join and barrier

def join():
    """The last rank to join, as an int32 scalar tensor (the core's ``join``)."""
    def join_engine(_arrays):
        return [np.asarray(core.join(), dtype=np.int32)]

    return run_hop(join_engine, [], [tf.int32], "join", [tf.TensorShape([])])[0]


def barrier(process_set=None):
    """Block until every rank has reached the barrier."""
    kw = core_kwargs(process_set)

    def wait_all(_arrays):
        core.barrier(**kw)
        return [np.zeros((), np.int32)]

    done = run_hop(wait_all, [], [tf.int32], "barrier", [tf.TensorShape([])])[0]
    return None if tf.executing_eagerly() else done

