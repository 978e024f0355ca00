"""Reduces one step's gradients over the ranks: the part shared by DistributedGradientTape
and the Keras DistributedOptimizer.

The whole list crosses to the engine in ONE hop: inside a ``tf.function``, dense gradients
of known shapes (reduced with anything but Adasum) go through the engine's own TensorFlow op
(engine_ops.py, csrc/tensorflow/tensorflow_kernels.cc), everything else through one ``tf.py_function``
(hops.py). Either way, each group of dense gradients (one group, or the ``groups`` the user
asked for) is packed into one flat buffer per dtype and reduced in place as one request
(gradient_buckets.py), whose views come back to TensorFlow without copies; ``tf.IndexedSlices``
go as allgathers of their values and indices, as Horovod does (unless ``sparse_as_dense``).
``None`` gradients stay ``None`` (every rank must agree on which are ``None``, as in Horovod).
With ``op=Adasum`` (DistributedGradientTape, as Horovod's tape) the gradients themselves are
combined with Adasum, each tensor on its own (csrc/algorithms/adasum.h); sparse gradients are refused.

Local variables (Horovod's ``register_local_source`` / ``register_local_var``) keep their
local gradients, divided by the set's size when ``scale_local_gradients`` (Horovod's default:
their updates then have the scale of the averaged ones). Keras 3 variables have no ``.ref()``,
so a variable is recognised by identity: the registered object itself or the ``tf.Variable``
behind a Keras variable.
"""
import numpy as np
import tensorflow as tf

from collectives import arguments, basics
from collectives import ops as core
from collectives.constants import Adasum, Average, OpType, Sum
from collectives.errors import raise_for_status
from collectives.handles import synchronize
from collectives.horovod_util import split_list
from collectives.shared_failure import failing_together

from .compression import Compression
from .gradient_buckets import plan_buckets
from . import engine_ops
from .hops import run_hop
from .naming import digest, layout_check_name, layout_record
from .process_sets import core_kwargs, included, process_set_id, set_size
from .tensors import share

# Engine-side plans kept per hop: one per distinct list of dtypes and shapes (a traced step
# has one; dynamic shapes would make new ones, so older ones are dropped past this many).
_MAX_PLANS = 8


def backing_variable(variable):
    """The tf.Variable behind a Keras 3 variable (None for anything else)."""
    backing = getattr(variable, "_value", None)
    return backing if isinstance(backing, tf.Variable) else None


def check_groups(groups):
    if groups is not None and not (isinstance(groups, list) or (isinstance(groups, int) and groups > 0)):
        raise ValueError("groups should be a non-negative integer or a list of list of tf.Variable.")


class GradientReducer:
    """``reduce(grads, variables)`` returns the grads combined over the ranks with ``op``
    (Average by default), in the same order and structure.

    Engine names: ``<prefix>.<digest>.g<j>`` for dense group j's buffer (``.g<j>.<b>`` for
    its buffer b when the group holds several dtypes; with Adasum, ``.g<j>.<i>`` for its
    member i) and ``<prefix>.<digest>.s<k>.values|indices`` for sparse gradient k; the digest of the
    dtypes and shapes makes them stable across steps (response-cache hits) and distinct
    between different gradient lists.

    Before the first reduction of a layout, every rank checks that the others reduce the same
    one, under ``<prefix>.<digest of the count and dtypes>.layout`` (csrc/frontend/layout_check.h):
    ranks whose shapes differ (the model differs between ranks) would otherwise submit
    different names and wait for each other forever; they raise TensorMismatchError instead
    (``tf.errors.FailedPreconditionError`` from the op or eagerly), naming the first gradient
    that differs (its position in the list given to ``reduce``) and its shape on each rank.
    A layout checked once is not checked again while the engine runs: no collective per step.
    """

    def __init__(self, prefix, compression=None, op=Average, gradient_predivide_factor=1.0, groups=None,
                 sparse_as_dense=False, process_set=None, scale_local_gradients=True):
        if gradient_predivide_factor != 1.0 and op != Average:
            raise ValueError("gradient_predivide_factor not supported with op != Average")
        check_groups(groups)
        core_kwargs(process_set)  # rejects unsupported process sets now rather than at the first step
        self.prefix = prefix
        self.compression = compression if compression is not None else Compression.none
        self.op = op
        self.gradient_predivide_factor = float(gradient_predivide_factor)
        self.groups = groups
        self.sparse_as_dense = sparse_as_dense
        self.process_set = process_set
        self.scale_local_gradients = scale_local_gradients
        self._local = []  # registered local variables, kept alive so that their ids stay theirs
        # The layout check's (name, record) per layout and labels: made once, not on every eager
        # step (whose hop and plans are new each time); whether to check is the engine's call.
        self._layout_checks = {}

    # ------------------------------------------------------------ local variables

    def register_local(self, variable):
        """Gradients of ``variable`` stay local (see the module docstring)."""
        if not any(variable is v for v in self._local):
            self._local.append(variable)

    def _local_positions(self, variables):
        if not self._local or variables is None:
            return []
        ids = {id(x) for v in self._local for x in (v, backing_variable(v)) if x is not None}
        return [i for i, v in enumerate(variables) if id(v) in ids or id(backing_variable(v)) in ids]

    def _scaled_local(self, grad):
        if grad is None or not self.scale_local_gradients:
            return grad
        n = set_size(self.process_set)
        if isinstance(grad, tf.IndexedSlices):
            return tf.IndexedSlices(grad.values / tf.cast(n, grad.values.dtype), grad.indices, grad.dense_shape)
        grad = tf.convert_to_tensor(grad)
        return grad / tf.cast(n, grad.dtype)

    # ------------------------------------------------------------ planning

    def _scale_args(self):
        """(reduce op, prescale, postscale): Average with a predivide factor f is a Sum
        scaled by 1/f before and f/size after."""
        if self.op == Average and self.gradient_predivide_factor != 1.0:
            f = self.gradient_predivide_factor
            return Sum, 1.0 / f, f / set_size(self.process_set)
        return self.op, 1.0, 1.0

    def _dense_groups(self, dense_idx, variables):
        """Lists of gradient positions reduced together as one grouped request."""
        if self.groups is None:
            return [dense_idx] if dense_idx else []
        if isinstance(self.groups, int):
            return [g for g in split_list(dense_idx, self.groups) if g]
        if variables is None:
            raise ValueError("groups given as lists of variables need the variables of the gradients")
        position = {id(v): i for i, v in enumerate(variables)}
        remaining = list(dense_idx)
        out = []
        for group in self.groups:
            members = [position[id(v)] for v in group if id(v) in position and position[id(v)] in remaining]
            for m in members:
                remaining.remove(m)
            if members:
                out.append(sorted(members))
        out.extend([i] for i in remaining)  # variables in no group travel alone, as in Horovod
        return out

    # ------------------------------------------------------------ reduction

    def reduce(self, grads, variables=None):
        grads = list(grads)
        local = self._local_positions(variables)
        if not local:
            return self._reduce(grads, variables)
        shared = [i for i in range(len(grads)) if i not in local]
        reduced = self._reduce([grads[i] for i in shared], [variables[i] for i in shared], shared)
        out = list(grads)
        for i, g in zip(shared, reduced):
            out[i] = g
        for i in local:
            out[i] = self._scaled_local(grads[i])
        return out

    def _reduce(self, grads, variables=None, positions=None):
        """``positions``: each gradient's index in the list given to ``reduce`` (for messages)."""
        if self.sparse_as_dense:
            grads = [tf.convert_to_tensor(g) if isinstance(g, tf.IndexedSlices) else g for g in grads]
        if not included(self.process_set) or set_size(self.process_set) == 1:
            return grads  # nothing to combine here (Horovod skips the collectives too)
        dense_idx = [i for i, g in enumerate(grads) if g is not None and not isinstance(g, tf.IndexedSlices)]
        sparse_idx = [i for i, g in enumerate(grads) if isinstance(g, tf.IndexedSlices)]
        if not dense_idx and not sparse_idx:
            return grads
        op, pre, post = self._scale_args()
        if sparse_idx and op == Adasum:  # refused with the message Horovod gives
            raise NotImplementedError("The Adasum reduction does not currently support sparse tensors. As a "
                                      "workaround please pass sparse_as_dense=True to DistributedOptimizer")
        if sparse_idx and op not in (Sum, Average):
            raise NotImplementedError("Only Sum and Average ops are supported with tf.IndexedSlices; pass "
                                      "sparse_as_dense=True")

        compressed, ctxs = {}, {}
        for i in dense_idx:
            compressed[i], ctxs[i] = self.compression.compress(tf.convert_to_tensor(grads[i]))
        groups = self._dense_groups(dense_idx, variables)
        dense_order = [i for group in groups for i in group]
        inputs = [compressed[i] for i in dense_order]
        for i in sparse_idx:
            inputs += [grads[i].values, grads[i].indices]
        where = (lambda i: i) if positions is None else (lambda i: positions[i])
        labels = [f"gradient {where(i)}" for i in dense_order]
        for i in sparse_idx:
            labels += [f"gradient {where(i)} (IndexedSlices values)", f"gradient {where(i)} (IndexedSlices indices)"]
        if not sparse_idx and op != Adasum and engine_ops.can_reduce_gradients(inputs):
            # Shapes are fully known here: the layout check's record is made once, at trace time.
            pairs = [(np.dtype(t.dtype.as_numpy_dtype), tuple(t.shape.as_list())) for t in inputs]
            outputs = engine_ops.reduce_gradients(inputs, [len(g) for g in groups],
                                                  f"{self.prefix}.{engine_ops.base_digest(inputs)}", op, pre, post,
                                                  process_set_id(self.process_set),
                                                  layout_check_name(self.prefix, [d for d, _ in pairs]),
                                                  layout_record(labels, pairs))
        else:
            outputs = run_hop(self._engine_fn(groups, len(sparse_idx), op, pre, post, tuple(labels)), inputs,
                              [t.dtype for t in inputs], "reduce_gradients", self._out_shapes(inputs, len(dense_order)))

        result = list(grads)
        for i, out in zip(dense_order, outputs):
            result[i] = self.compression.decompress(out, ctxs[i])
        sparse_scale = pre * post / (set_size(self.process_set) if op == Average else 1)
        rest = outputs[len(dense_order):]
        for k, i in enumerate(sparse_idx):
            values, indices = rest[2 * k], rest[2 * k + 1]
            if sparse_scale != 1.0:
                values = values * tf.cast(sparse_scale, values.dtype)
            result[i] = tf.IndexedSlices(values, indices, dense_shape=grads[i].dense_shape)
        return result

    @staticmethod
    def _out_shapes(inputs, n_dense):
        shapes = [t.shape for t in inputs[:n_dense]]
        for t in inputs[n_dense:]:
            shapes.append(tf.TensorShape([None]).concatenate(t.shape[1:]) if t.shape.rank else t.shape)
        return shapes

    def _engine_fn(self, groups, n_sparse, op, pre, post, labels):
        """The numpy side of the hop: submit everything, then wait for everything.

        Each dense group goes to the engine as one flat buffer per dtype, reduced in place
        (gradient_buckets.py), and its results come back as views of that buffer that
        TensorFlow borrows; Adasum, which combines each tensor on its own, sends the group's
        tensors as they are. The plan (names, buffer layouts) is made on the first step and
        reused while the arrays' dtypes and shapes stay the same; a new plan first runs the
        layout check (at once when the engine already agreed on the layout: see the class).
        """
        kw = core_kwargs(self.process_set)
        n_dense = sum(len(g) for g in groups)
        bounds = []
        start = 0
        for g in groups:
            bounds.append((start, start + len(g)))
            start += len(g)
        ragged = set(range(n_dense, n_dense + 2 * n_sparse))
        packed = op != Adasum
        plans = {}

        def plan(arrays):
            key = tuple((a.dtype, a.shape[1:] if i in ragged else a.shape) for i, a in enumerate(arrays))
            found = plans.get(key)
            if found is None:
                if len(plans) >= _MAX_PLANS:  # shapes that change every step: keep only recent ones
                    plans.clear()
                check = self._layout_checks.get((key, labels))
                if check is None:
                    if len(self._layout_checks) >= _MAX_PLANS:
                        self._layout_checks.clear()
                    pairs = [(a.dtype, (None,) + a.shape[1:] if i in ragged else a.shape) for i, a in enumerate(arrays)]
                    check = self._layout_checks[(key, labels)] = (
                        layout_check_name(self.prefix, [a.dtype for a in arrays]), layout_record(labels, pairs))
                raise_for_status(*basics.engine().check_layout(*check, process_set_id(self.process_set)))
                base = f"{self.prefix}.{digest(arrays, ragged)}"
                layouts = [plan_buckets(arrays, range(a, b)) for a, b in bounds] if packed else None
                found = plans[key] = (base, layouts)
            return found

        def submit_group(j, a, b, arrays, base, layouts):
            name = f"{base}.g{j}"
            if layouts is None:
                return core.grouped_allreduce_async(arrays[a:b], op=op, name=name, prescale_factor=pre,
                                                    postscale_factor=post, **kw), None
            buckets = layouts[j]
            if len(buckets) == 1:
                with failing_together(OpType.ALLREDUCE, [name], kw["process_set"]):
                    flat = buckets[0].pack(arrays)
                return core.allreduce_async_(flat, op=op, name=name, prescale_factor=pre, postscale_factor=post,
                                             **kw), [flat]
            names = arguments.member_names(name, len(buckets))  # the grouped request's own names
            with failing_together(OpType.ALLREDUCE, names, kw["process_set"], name, len(buckets)):
                flats = [bucket.pack(arrays) for bucket in buckets]
            return core.grouped_allreduce_async_(flats, op=op, name=name, prescale_factor=pre,
                                                 postscale_factor=post, **kw), flats

        def reduce_arrays(arrays):
            base, layouts = plan(arrays)
            dense = [submit_group(j, a, b, arrays, base, layouts) for j, (a, b) in enumerate(bounds)]
            sparse = []
            for k in range(n_sparse):
                values, indices = arrays[n_dense + 2 * k], arrays[n_dense + 2 * k + 1]
                sparse.append(core.allgather_async(values, name=f"{base}.s{k}.values", **kw))
                sparse.append(core.allgather_async(indices, name=f"{base}.s{k}.indices", **kw))
            out = [None] * n_dense
            for j, ((a, b), (handle, flats)) in enumerate(zip(bounds, dense)):
                result = synchronize(handle)
                if flats is None:
                    out[a:b] = result
                    continue
                for bucket, flat in zip(layouts[j], flats):
                    bucket.unpack(flat, out)
                out[a:b] = [share(view) for view in out[a:b]]
            out.extend(synchronize(h) for h in sparse)
            return out

        return reduce_arrays
