"""horovod.tensorflow's collective functions, with Horovod's signatures and semantics, on top
of the differentiable verbs (adapters.tensorflow.functions). They work eagerly and inside
``tf.function``; ``device_dense``/``device_sparse``/``ignore_name_scope`` are accepted for
compatibility and ignored (names are never prefixed with TensorFlow name scopes, so they
match across ranks whatever scopes the ranks are in).
"""

import tensorflow as tf

from collectives import basics, objects
from collectives.constants import Adasum, Average, Sum, resolve_op
from collectives.errors import InvalidArgumentError
from collectives.process_sets import process_set_by_id

from . import functions as fn
from . import ops as raw
from .compression import Compression
from .hops import check_not_tf1_graph
from .process_sets import core_kwargs, global_process_set, set_size
from .tensors import as_tensor

# Autograph would otherwise convert this library's code (recursively, once per function)
# whenever a user's tf.function calls it: slow, and nothing here needs conversion.
not_converted = tf.autograph.experimental.do_not_convert


def handle_average_backwards_compatibility(op, average):
    """Horovod's rule: ``op`` wins; the deprecated ``average`` bool maps to Average/Sum; default Average."""
    return resolve_op(op, average, stacklevel=5)  # user -> do_not_convert wrapper -> verb -> here


def _executing_eagerly():
    """Horovod's helper: True outside graph construction (what ``tf.executing_eagerly`` says)."""
    return tf.executing_eagerly()


def _sparse_allreduce(slices, op, name, prescale_factor, postscale_factor, process_set):
    """An IndexedSlices "allreduce": allgather values and indices (one hop), as Horovod does.
    Average divides the values by the set's size with TensorFlow's true division, as Horovod
    does: integer values give floating-point quotients (int32 -> float64)."""
    if op == Adasum:
        raise NotImplementedError("The Adasum reduction does not currently support sparse tensors. As a "
                                  "workaround please pass sparse_as_dense=True to DistributedOptimizer")
    if op not in (Sum, Average):
        raise NotImplementedError("Only Sum and Average ops are supported with tf.IndexedSlices")
    if float(prescale_factor) != 1.0 or float(postscale_factor) != 1.0:
        raise NotImplementedError("Pre/postscale_factor are not supported with tf.IndexedSlices")
    values, indices = raw.grouped_allgather([slices.values, slices.indices], name, process_set)
    if op == Average:
        values = values / tf.cast(set_size(process_set), values.dtype)
    return tf.IndexedSlices(values, indices, dense_shape=slices.dense_shape)


# ---------------------------------------------------------------- allreduce

@not_converted
def allreduce(tensor, average=None, device_dense="", device_sparse="", compression=Compression.none, op=None,
              prescale_factor=1.0, postscale_factor=1.0, name=None, process_set=global_process_set,
              ignore_name_scope=False):
    """Reduce a tf.Tensor (or tf.Variable, or tf.IndexedSlices) over all ranks; Average by default.

    Differentiable: the gradient is the same allreduce of the upstream gradient.
    ``tf.IndexedSlices`` are allgathered (values and indices) instead, as in Horovod.
    """
    op = handle_average_backwards_compatibility(op, average)
    core_kwargs(process_set)
    if isinstance(tensor, tf.IndexedSlices):
        return _sparse_allreduce(tensor, op, name, prescale_factor, postscale_factor, process_set)
    tensor = as_tensor(tensor, "allreduce")
    compressed, ctx = compression.compress(tensor)
    reduced = fn.allreduce(compressed, op, name, prescale_factor, postscale_factor, process_set)
    return compression.decompress(reduced, ctx)


@not_converted
def grouped_allreduce(tensors, average=None, device_dense="", device_sparse="", compression=Compression.none,
                      op=None, prescale_factor=1.0, postscale_factor=1.0, process_set=global_process_set,
                      ignore_name_scope=False, name=None):
    """Allreduce a list of tensors negotiated and executed together (one hop, fused by the
    engine); ``tf.IndexedSlices`` in the list are allgathered. Differentiable."""
    tensors = list(tensors)
    if not tensors:
        return tensors
    op = handle_average_backwards_compatibility(op, average)
    core_kwargs(process_set)
    out = [None] * len(tensors)
    dense_idx = [i for i, t in enumerate(tensors) if not isinstance(t, tf.IndexedSlices)]
    for k, i in enumerate(i for i, t in enumerate(tensors) if isinstance(t, tf.IndexedSlices)):
        sparse_name = f"{name}.sparse.{k}" if name else None
        out[i] = _sparse_allreduce(tensors[i], op, sparse_name, prescale_factor, postscale_factor, process_set)
    if dense_idx:
        pairs = [compression.compress(as_tensor(tensors[i], "grouped_allreduce")) for i in dense_idx]
        reduced = fn.grouped_allreduce([c for c, _ in pairs], op, name, prescale_factor, postscale_factor,
                                       process_set)
        for i, r, (_, ctx) in zip(dense_idx, reduced, pairs):
            out[i] = compression.decompress(r, ctx)
    return out


# ---------------------------------------------------------------- allgather

@not_converted
def allgather(tensor, name=None, ignore_name_scope=False, process_set=global_process_set):
    """Concatenate every rank's tensor along the first dimension (which may differ per rank).
    Differentiable: the gradient is this rank's rows of the Average-allreduced upstream gradient."""
    core_kwargs(process_set)
    return fn.allgather(tensor, name, process_set)


@not_converted
def grouped_allgather(tensors, name=None, ignore_name_scope=False, process_set=global_process_set):
    core_kwargs(process_set)
    return fn.grouped_allgather(list(tensors), name, process_set)


# ---------------------------------------------------------------- broadcast

@not_converted
def broadcast(tensor, root_rank, name=None, ignore_name_scope=False, process_set=global_process_set):
    """``root_rank``'s tensor on every rank. Differentiable: the gradient is the
    Average-allreduced upstream gradient on the root and zeros elsewhere."""
    core_kwargs(process_set)
    return fn.broadcast(tensor, root_rank, name, process_set)


@not_converted
def broadcast_(variables, root_rank, name=None, process_set=global_process_set):
    """Broadcast variables in place (assigns root's values); returns their new values."""
    variables = list(variables)
    values = raw.grouped_broadcast(variables, root_rank, name or "broadcast_", process_set)
    for var, value in zip(variables, values):
        var.assign(value)
    return values


@not_converted
def broadcast_global_variables(root_rank):
    """Horovod's TF1 helper: broadcast ``tf.compat.v1.global_variables()``. Eager execution has
    no global variables: RuntimeError, as in Horovod; a TensorFlow 1 graph is refused
    (``GraphModeNotSupportedError``, see adapters/tensorflow/hops.py); inside a ``tf.function``
    it returns the op assigning the function graph's global variables (usually none)."""
    if _executing_eagerly():
        raise RuntimeError("hvd.broadcast_global_variables() does not support eager execution. Please use "
                           "`hvd.broadcast_variables(<model/optimizer variables>)` instead.")
    check_not_tf1_graph("broadcast_global_variables")
    variables = list(tf.compat.v1.global_variables())
    if not variables:
        return tf.no_op()
    values = raw.grouped_broadcast(variables, root_rank, "broadcast_global_variables")
    return tf.group(*[var.assign(value) for var, value in zip(variables, values)])


@not_converted
def broadcast_variables(variables, root_rank, process_set=global_process_set, inplace=False):
    """Assign ``root_rank``'s values to ``variables`` on every rank (one hop for all of them).
    Works eagerly and inside ``tf.function``."""
    del inplace  # variables are always assigned in place here
    variables = list(variables)
    if not variables:
        return
    values = raw.grouped_broadcast(variables, root_rank, "broadcast_variables", process_set)
    for var, value in zip(variables, values):
        var.assign(value)  # inside tf.function, automatic control dependencies run the assignments


# ---------------------------------------------------------------- alltoall

@not_converted
def alltoall(tensor, splits=None, name=None, ignore_name_scope=False, process_set=global_process_set):
    """Rows ``splits[i]`` of the first dimension go to rank i (equal parts without splits).
    Returns the received tensor, or ``(received, received_splits)`` when ``splits`` is given.
    Differentiable: the gradient travels back with the received splits."""
    core_kwargs(process_set)
    output, received_splits = fn.alltoall(tensor, splits, name, process_set)
    return output if splits is None else (output, received_splits)


# ---------------------------------------------------------------- reducescatter

@not_converted
def reducescatter(tensor, device_dense="", compression=Compression.none, op=Average, name=None,
                  process_set=global_process_set, ignore_name_scope=False, prescale_factor=1.0,
                  postscale_factor=1.0):
    """Reduce over ranks; rank i keeps block i of the first dimension (the first
    ``dim0 % size`` ranks get one extra row). Differentiable (Horovod's gradient: the
    allgathered upstream gradient, times the number of ranks for Sum)."""
    core_kwargs(process_set)
    op = Average if op is None else op
    compressed, ctx = compression.compress(as_tensor(tensor, "reducescatter"))
    out = fn.reducescatter(compressed, op, name, prescale_factor, postscale_factor, process_set)
    return compression.decompress(out, ctx)


@not_converted
def grouped_reducescatter(tensors, device_dense="", compression=Compression.none, op=Average,
                          process_set=global_process_set, prescale_factor=1.0, postscale_factor=1.0, name=None):
    core_kwargs(process_set)
    op = Average if op is None else op
    pairs = [compression.compress(as_tensor(t, "grouped_reducescatter")) for t in tensors]
    outs = fn.grouped_reducescatter([c for c, _ in pairs], op, name, prescale_factor, postscale_factor,
                                    process_set)
    return [compression.decompress(o, ctx) for o, (_, ctx) in zip(outs, pairs)]


# ---------------------------------------------------------------- others

@not_converted
def join():
    """Tell the other ranks this rank has finished its data; blocks until every rank has
    joined and returns the last rank to join (an int32 scalar tensor). Until then, this rank
    contributes zeros to the allreduces the others still submit."""
    return raw.join()


@not_converted
def barrier(process_set=global_process_set):
    """Block until every rank has reached the barrier."""
    return raw.barrier(process_set)


@not_converted
def broadcast_object(obj, root_rank=0, session=None, name=None, process_set=global_process_set):
    """``root_rank``'s picklable object on every rank (eager only)."""
    return objects.broadcast_object(obj, root_rank, name, **core_kwargs(process_set))


def broadcast_object_fn(root_rank=0, session=None, name=None, process_set=global_process_set):
    """Horovod's factory: a function ``f(obj)`` that returns ``root_rank``'s object (eager only)."""
    def broadcast_fn(obj):
        return broadcast_object(obj, root_rank, session=session, name=name, process_set=process_set)
    return broadcast_fn


@not_converted
def allgather_object(obj, session=None, name=None, process_set=global_process_set):
    """The list of every rank's picklable object, in rank order (eager only)."""
    return objects.allgather_object(obj, name, **core_kwargs(process_set))


# Horovod's codes for a set id the engine does not know (HOROVOD_PROCESS_SET_ERROR_UNKNOWN_SET):
# its size and included ops return it as their value instead of raising.
_UNKNOWN_SET = -3


def _registered_set(process_set_id):
    try:
        return process_set_by_id(process_set_id)
    except InvalidArgumentError:
        return None


@not_converted
def size_op(process_set_id=0, name=None):
    """The number of ranks in the registered set ``process_set_id`` (all ranks for 0), as an
    int32 tensor; the same on ranks outside the set (as Horovod's op); -3 for an unknown id."""
    ps = _registered_set(process_set_id)
    return tf.constant(_UNKNOWN_SET if ps is None else set_size(ps), tf.int32, name=name)


@not_converted
def process_set_included_op(process_set_id=0, name=None):
    """1 (an int32 tensor) if this rank belongs to the registered set ``process_set_id``, else 0;
    -3, as Horovod's op, for an id that is not registered."""
    ps = _registered_set(process_set_id)
    return tf.constant(_UNKNOWN_SET if ps is None else int(bool(ps.included())), tf.int32, name=name)


# Horovod's rank_op, local_size_op and local_rank_op take no process set: job-wide values.
@not_converted
def local_size_op(name=None):
    return tf.constant(basics.local_size(), tf.int32, name=name)


@not_converted
def rank_op(name=None):
    return tf.constant(basics.rank(), tf.int32, name=name)


@not_converted
def local_rank_op(name=None):
    return tf.constant(basics.local_rank(), tf.int32, name=name)
