"""The differentiable collectives: ``tf.custom_gradient`` around the hops of ``ops``, with
horovod.tensorflow's gradients (which assume every rank's loss enters the total alike):

- allreduce:     the same allreduce (op and scale factors) of the upstream gradient;
- allgather:     Average-allreduce of the upstream gradient, then this rank's rows;
- broadcast:     Average-allreduce of the upstream gradient on the root, zeros elsewhere;
- alltoall:      alltoall of the upstream gradient back with the received splits;
- reducescatter: allgather of the upstream gradient, times the number of ranks for Sum
                 (and the scale factors).

Gradient collectives are named ``<name>.grad`` when the forward call was named, and get
automatic names otherwise (every rank differentiates the same program in the same order).
Tensors that are not floating point carry no gradient and skip the wrapper.
"""
import tensorflow as tf

from collectives.constants import Average, Sum

from . import ops as raw
from .process_sets import set_rank, set_size
from .tensors import as_tensor


def _grad_name(name, suffix="grad"):
    return f"{name}.{suffix}" if name else None


def _differentiable(tensor):
    return tensor.dtype.is_floating


def allreduce(tensor, op, name=None, prescale_factor=1.0, postscale_factor=1.0, process_set=None):
    tensor = as_tensor(tensor, "allreduce")
    if not _differentiable(tensor):
        return raw.allreduce(tensor, op, name, prescale_factor, postscale_factor, process_set)

    @tf.custom_gradient
    def allreduce_fn(x):
        def grad(dy):
            return raw.allreduce(dy, op, _grad_name(name), prescale_factor, postscale_factor, process_set)
        return raw.allreduce(x, op, name, prescale_factor, postscale_factor, process_set), grad

    return allreduce_fn(tensor)


def grouped_allreduce(tensors, op, name=None, prescale_factor=1.0, postscale_factor=1.0, process_set=None):
    tensors = [as_tensor(t, "grouped_allreduce") for t in tensors]
    if not tensors:
        return []
    if not all(_differentiable(t) for t in tensors):
        return raw.grouped_allreduce(tensors, op, name, prescale_factor, postscale_factor, process_set)

    @tf.custom_gradient
    def grouped_allreduce_fn(*xs):
        def grad(*dys):
            return raw.grouped_allreduce(list(dys), op, _grad_name(name), prescale_factor, postscale_factor,
                                         process_set)
        return raw.grouped_allreduce(list(xs), op, name, prescale_factor, postscale_factor, process_set), grad

    return list(grouped_allreduce_fn(*tensors))


def _first_dims(tensors):
    """Each tensor's first dimension (1 for a scalar, which allgather treats as one row)."""
    return tf.stack([tf.shape(t, out_type=tf.int64)[0] if t.shape.rank != 0 else tf.constant(1, tf.int64)
                     for t in tensors])


def _my_rows(reduced, x, offset, dim0):
    rows = tf.slice(reduced, tf.concat([[offset], tf.zeros([tf.rank(reduced) - 1], tf.int64)], 0),
                    tf.concat([[dim0], tf.fill([tf.rank(reduced) - 1], tf.constant(-1, tf.int64))], 0))
    return tf.reshape(rows, tf.shape(x))


def allgather(tensor, name=None, process_set=None):
    tensor = as_tensor(tensor, "allgather", moves_bytes=True)
    if not _differentiable(tensor):
        return raw.allgather(tensor, name, process_set)

    @tf.custom_gradient
    def allgather_fn(x):
        def grad(dy):
            reduced = raw.allreduce(dy, Average, _grad_name(name), process_set=process_set)
            dims = raw.allgather(_first_dims([x]), _grad_name(name, "grad.dims"), process_set)
            offset = tf.reduce_sum(dims[:set_rank(process_set)])
            return _my_rows(reduced, x, offset, dims[set_rank(process_set)])
        return raw.allgather(x, name, process_set), grad

    return allgather_fn(tensor)


def grouped_allgather(tensors, name=None, process_set=None):
    tensors = [as_tensor(t, "grouped_allgather", moves_bytes=True) for t in tensors]
    if not tensors:
        return []
    if not all(_differentiable(t) for t in tensors):
        return raw.grouped_allgather(tensors, name, process_set)

    @tf.custom_gradient
    def grouped_allgather_fn(*xs):
        def grad(*dys):
            reduced = raw.grouped_allreduce(list(dys), Average, _grad_name(name), process_set=process_set)
            dims = raw.allgather(tf.reshape(_first_dims(xs), [1, -1]), _grad_name(name, "grad.dims"),
                                 process_set)  # (ranks, tensors)
            r = set_rank(process_set)
            offsets = tf.reduce_sum(dims[:r], axis=0)
            return [_my_rows(red, x, offsets[i], dims[r, i]) for i, (red, x) in enumerate(zip(reduced, xs))]
        return raw.grouped_allgather(list(xs), name, process_set), grad

    return list(grouped_allgather_fn(*tensors))


def broadcast(tensor, root_rank, name=None, process_set=None):
    tensor = as_tensor(tensor, "broadcast", moves_bytes=True)
    if not _differentiable(tensor):
        return raw.broadcast(tensor, root_rank, name, process_set)

    @tf.custom_gradient
    def broadcast_fn(x):
        def grad(dy):
            reduced = raw.allreduce(dy, Average, _grad_name(name), process_set=process_set)
            return reduced if set_rank(process_set) == root_rank else tf.zeros_like(reduced)
        return raw.broadcast(x, root_rank, name, process_set), grad

    return broadcast_fn(tensor)


def alltoall(tensor, splits=None, name=None, process_set=None):
    """Returns ``(received, received_splits)``."""
    tensor = as_tensor(tensor, "alltoall", moves_bytes=True)
    if not _differentiable(tensor):
        return raw.alltoall(tensor, splits, name, process_set)

    @tf.custom_gradient
    def alltoall_fn(x):
        out, received_splits = raw.alltoall(x, splits, name, process_set)

        def grad(dy, _d_splits):
            back, _ = raw.alltoall(dy, received_splits, _grad_name(name), process_set)
            # Rows after the splits' sum were not sent: zeros (as many as x has beyond back's).
            unsent = tf.shape(x)[0] - tf.shape(back)[0]
            back = tf.concat([back, tf.zeros(tf.concat([[unsent], tf.shape(back)[1:]], 0), back.dtype)], 0)
            return tf.reshape(back, tf.shape(x))
        return (out, received_splits), grad

    out, received_splits = alltoall_fn(tensor)
    return out, received_splits


def _reducescatter_grad_scale(op, prescale_factor, postscale_factor, process_set):
    scale = float(prescale_factor) * float(postscale_factor)
    if op == Sum:
        scale *= set_size(process_set)
    return scale


def reducescatter(tensor, op, name=None, prescale_factor=1.0, postscale_factor=1.0, process_set=None):
    tensor = as_tensor(tensor, "reducescatter")
    if not _differentiable(tensor):
        return raw.reducescatter(tensor, op, name, prescale_factor, postscale_factor, process_set)
    scale = _reducescatter_grad_scale(op, prescale_factor, postscale_factor, process_set)

    @tf.custom_gradient
    def reducescatter_fn(x):
        def grad(dy):
            gathered = raw.allgather(dy, _grad_name(name), process_set)
            return tf.reshape(gathered * tf.cast(scale, dy.dtype), tf.shape(x))
        return raw.reducescatter(x, op, name, prescale_factor, postscale_factor, process_set), grad

    return reducescatter_fn(tensor)


def grouped_reducescatter(tensors, op, name=None, prescale_factor=1.0, postscale_factor=1.0, process_set=None):
    tensors = [as_tensor(t, "grouped_reducescatter") for t in tensors]
    if not tensors:
        return []
    if not all(_differentiable(t) for t in tensors):
        return raw.grouped_reducescatter(tensors, op, name, prescale_factor, postscale_factor, process_set)
    scale = _reducescatter_grad_scale(op, prescale_factor, postscale_factor, process_set)

    @tf.custom_gradient
    def grouped_reducescatter_fn(*xs):
        def grad(*dys):
            gathered = raw.grouped_allgather(list(dys), _grad_name(name), process_set)
            return [tf.reshape(g * tf.cast(scale, g.dtype), tf.shape(x)) for g, x in zip(gathered, xs)]
        return raw.grouped_reducescatter(list(xs), op, name, prescale_factor, postscale_factor, process_set), grad

    return list(grouped_reducescatter_fn(*tensors))
