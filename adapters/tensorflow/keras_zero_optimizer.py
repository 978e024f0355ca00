"""``DistributedOptimizer(..., zero_stage=1 or 2)`` for Keras 3: optimizer state (and, at stage 2,
accumulated gradients) sharded over the ranks of the process set, after ZeRO (arXiv 1910.02054),
with the torch design (adapters/torch/zero_optimizer.py, docs/zero.md).

The wrapper is an object of a dynamic subclass of the user's optimizer class (as the unsharded
wrapper, keras_optimizer.py), but the Keras optimizer inside it is built on *shard variables*:
one flat ``keras.Variable`` per bucket (keras_zero_layout.py) holding this rank's contiguous
1/N slice of the bucket. Its slots (momentum, Adam's moments) exist for those slices only.
``apply(grads, variables)`` (``model.fit``'s train step, ``apply_gradients``, custom loops):

1. each bucket's gradients are concatenated into one flat tensor (zeros for a variable with no
   gradient, and in the padding), and all buckets are reducescattered in one hop;
2. the shard variables are refreshed from the model's variables (a 1/N copy: the model's
   variables stay the truth, so ``set_weights`` or a broadcast between steps just works);
3. the wrapped class's own ``apply`` steps the shards (clipping, weight decay, its update);
4. the updated shards are allgathered in one hop and assigned back to the model's variables
   (not to a variable that got no gradient in this step: Keras would skip it too).

Everything runs eagerly and inside ``tf.function`` (the hops are ``py_function`` ops, run in
program order). ``global_clipnorm`` is computed over every shard (one allreduce of one number:
``_ShardClipping``). Under a LossScaleOptimizer, the "gradients are finite" decision is agreed
over the ranks (one allreduce) before Keras' branch, so no rank skips a step the others take.

Stages: the gradients Keras hands to ``apply`` are the train step's tensors, freed after it
either way. With ``backward_passes_per_step > 1``, stage 1 accumulates whole gradients locally and
reducescatters once per update; stage 2 reducescatters every pass and accumulates only this
rank's shard (1/N of the accumulator memory, N times the reducescatters).
"""
import os
import zlib

import tensorflow as tf

from collectives import objects
from collectives.constants import Average, Min, Sum
from collectives.errors import NotSupportedError
from collectives.zero_agreement import agree
from collectives.zero_arguments import check_arguments

from . import keras_zero_checkpoint, keras_zero_sharded
from . import ops as raw
from .compression import Compression
from .keras_flavors import CollectivesOptimizer
from .keras_zero_checks import check_optimizer
from .keras_zero_layout import build_buckets, signature
from .process_sets import included, set_rank, set_size

not_converted = tf.autograph.experimental.do_not_convert
SHARD_NAME = "collectives_zero_shard"


def _communicates(process_set):
    return included(process_set) and set_size(process_set) > 1


class _Runtime:
    """What Keras must not track or save (a plain object, so Keras' attribute tracking leaves it alone)."""

    def __init__(self):
        self.variables = None     # the model's trainable variables, as build() got them
        self.positions = None     # id of a variable -> its position there
        self.buckets = None
        self.shards = None        # one keras.Variable per bucket: this rank's slice
        self.accumulators = None  # backward_passes_per_step > 1: per variable (stage 1) or per shard (stage 2)
        self.counter = None
        self.name = None          # the start of the engine names (_prefix)
        self.ranks, self.rank = 1, 0  # the layout's: the shards' count and this rank's


def _base_name(settings, stage):
    """The start of every engine name of a sharded optimizer. Not the optimizer's own name: Keras
    numbers those per process ("adam", "adam_1"), which can differ between ranks."""
    return f"{settings.prefix or 'DistributedOptimizer'}.zero{stage}"


def _prefix(optimizer):
    """Engine names of this optimizer's collectives: the layout's digest keeps two sharded
    optimizers of different models apart."""
    return optimizer._zero().name


def _clip_by_global_norm(grads, clip_norm, process_set, name):
    """Keras' clip_by_global_norm over the gradients of every rank's shards: the squared norms
    of this rank's shards, summed over the ranks (the padding holds zeros)."""
    present = [g for g in grads if g is not None]
    local = tf.add_n([tf.reduce_sum(tf.square(tf.cast(g, tf.float32))) for g in present])
    if _communicates(process_set):
        local = raw.allreduce(tf.reshape(local, [1]), Sum, name=name, process_set=process_set)[0]
    norm = tf.sqrt(local)
    scale = clip_norm * tf.minimum(1.0 / norm, 1.0 / clip_norm)
    scale = scale + (norm - norm)  # NaN for a non-finite norm, as Keras
    return [g * tf.cast(scale, g.dtype) if g is not None else None for g in grads]


class _ShardClipping:
    """Mixin for the Keras optimizer that steps the shards (the wrapper, or a LossScaleOptimizer's
    inner optimizer): ``global_clipnorm`` over every rank's shards."""

    _collectives_settings = None
    _zero_stage = 0

    def _clip_gradients(self, grads):
        if self.global_clipnorm and self.global_clipnorm > 0 and not self.clipnorm:
            settings = self._collectives_settings
            name = f"{_base_name(settings, self._zero_stage)}.global_norm"
            return _clip_by_global_norm(grads, self.global_clipnorm, settings.process_set, name)
        return super()._clip_gradients(grads)


class _ZeroOptimizer(_ShardClipping, CollectivesOptimizer):
    """Mixin placed before the Keras 3 optimizer class in a dynamic subclass."""

    def _zero(self):
        runtime = self.__dict__.get("_collectives_zero")
        if runtime is None:
            runtime = self.__dict__["_collectives_zero"] = _Runtime()
        return runtime

    def register_local_var(self, var):
        raise NotSupportedError(f"zero_stage={self._zero_stage}: local variables (register_local_var, "
                                "PartialDistributedOptimizer) are not supported with a sharded optimizer")

    # -- build: the layout, agreed by every rank, and the Keras optimizer built on the shards

    @not_converted
    def build(self, variables):
        runtime = self._zero()
        if runtime.variables is not None:
            return
        import keras

        variables = list(variables)
        settings = self._collectives_settings
        ps = settings.process_set
        comm = _communicates(ps)
        ranks, rank = (set_size(ps), set_rank(ps)) if comm else (1, 0)
        problem = sig = buckets = None
        try:
            buckets = build_buckets(variables, ranks, rank)
            sig = signature(buckets, variables)
        except Exception as e:  # noqa: BLE001 - shared with the other ranks before it is raised
            problem = e
        if comm:
            with tf.init_scope():
                agree(problem, sig, ps, self._zero_stage, name=f"{_base_name(settings, self._zero_stage)}.layout")
        elif problem is not None:
            raise problem
        with tf.init_scope():  # plain variables, created eagerly even when build runs in a tf.function
            shards = [keras.Variable(initializer="zeros", shape=(b.shard_length,), dtype=b.dtype.name,
                                     trainable=False, name=f"{SHARD_NAME}_{i}") for i, b in enumerate(buckets)]
            if settings.backward_passes_per_step > 1:
                like = variables if self._zero_stage == 1 else shards
                runtime.accumulators = [tf.Variable(tf.zeros(v.shape, v.dtype), trainable=False,
                                                    name="collectives_accumulator") for v in like]
                runtime.counter = tf.Variable(0, dtype=tf.int64, trainable=False, name="collectives_passes")
        runtime.variables, runtime.buckets, runtime.shards = variables, buckets, shards
        runtime.ranks, runtime.rank = ranks, rank
        runtime.name = f"{_base_name(settings, self._zero_stage)}.{zlib.crc32(repr(sig).encode()):08x}"
        runtime.positions = {id(v): i for i, v in enumerate(variables)}
        super().build(shards)

    # -- apply

    @not_converted
    def apply(self, grads, trainable_variables=None):
        grads = list(grads)
        runtime = self._zero()
        if trainable_variables is not None:
            trainable_variables = list(trainable_variables)
            if runtime.variables is None:
                self.build(trainable_variables)
                self.built = True
        elif runtime.variables is None:
            raise ValueError("When passing `grads` without `variables`, the optimizer must already be built on a "
                             "list of variables. Call `optimizer.build(trainable_variables)` first.")
        if not grads:
            return None
        full = [None] * len(runtime.variables)
        for g, v in zip(grads, trainable_variables if trainable_variables is not None else runtime.variables):
            position = runtime.positions.get(id(v))
            if position is None:
                raise ValueError(f"Unknown variable: {getattr(v, 'path', v)}. This optimizer can only be called for "
                                 f"the variables it was originally built with.")
            full[position] = g
        present = [g is not None for g in full]
        if not any(present):
            raise ValueError("No gradients provided for any variable.")
        passes = self._collectives_settings.backward_passes_per_step
        if passes == 1:
            return self._apply_shards(self._reduce_scatter(full), present)
        return self._accumulate_or_apply(full, present, passes)

    def _reduce_scatter(self, full):
        """This rank's slice of every bucket's gradient, reduced over the ranks (one hop)."""
        runtime = self._zero()
        settings = self._collectives_settings
        flats = []
        for b in runtime.buckets:
            parts = []
            for slot in b.slots:
                g = full[slot.index]
                if g is None:
                    parts.append(tf.zeros([slot.numel], b.dtype))
                    continue
                if isinstance(g, tf.IndexedSlices):
                    if not settings.sparse_as_dense:
                        path = getattr(runtime.variables[slot.index], "path", "")
                        raise NotSupportedError(
                            f"zero_stage={self._zero_stage}: variable {path} got a sparse gradient "
                            f"(tf.IndexedSlices); sharding needs dense ones: pass sparse_as_dense=True")
                    g = tf.convert_to_tensor(g)
                parts.append(tf.reshape(tf.cast(g, b.dtype), [-1]))
            if b.length > b.used():
                parts.append(tf.zeros([b.length - b.used()], b.dtype))
            flats.append(tf.concat(parts, 0) if len(parts) > 1 else parts[0])
        if not _communicates(settings.process_set):
            return flats
        compression = settings.compression or Compression.none
        compressed, ctxs = zip(*[compression.compress(f) for f in flats])
        op, pre, post = self._scale_args()
        outs = raw.grouped_reducescatter(list(compressed), op, name=f"{_prefix(self)}.reducescatter",
                                         prescale_factor=pre, postscale_factor=post,
                                         process_set=settings.process_set)
        return [tf.cast(compression.decompress(o, c), b.dtype) for o, c, b in zip(outs, ctxs, runtime.buckets)]

    def _scale_args(self):
        settings = self._collectives_settings
        if settings.op == Average and settings.gradient_predivide_factor != 1.0:
            f = settings.gradient_predivide_factor
            return Sum, 1.0 / f, f / set_size(settings.process_set)
        return settings.op, 1.0, 1.0

    def _read_shards(self):
        """Each shard refreshed from the model's variables."""
        runtime = self._zero()
        for b, shard in zip(runtime.buckets, runtime.shards):
            parts, filled = [], 0
            for slot, src, _, n in b.pieces():
                parts.append(tf.reshape(runtime.variables[slot.index].value, [-1])[src:src + n])
                filled += n
            if filled < b.shard_length:
                parts.append(tf.zeros([b.shard_length - filled], b.dtype))
            shard.assign(tf.concat(parts, 0) if len(parts) > 1 else parts[0])

    def _agree_finite(self, shard_grads):
        """Under a LossScaleOptimizer: every rank's shards finite, or every rank's made non-finite
        (one allreduce), so Keras' finite branch is the same on every rank."""
        ps = self._collectives_settings.process_set
        local = tf.reduce_all(tf.stack([tf.reduce_all(tf.math.is_finite(g)) for g in shard_grads]))
        flag = tf.reshape(tf.cast(local, tf.float32), [1])
        if _communicates(ps):
            flag = raw.allreduce(flag, Min, name=f"{_prefix(self)}.finite", process_set=ps)
        poison = tf.where(flag[0] > 0.5, tf.constant(0.0), tf.constant(float("nan")))
        return [g + tf.cast(poison, g.dtype) for g in shard_grads]

    def _apply_shards(self, shard_grads, present):
        import keras

        runtime = self._zero()
        self._read_shards()
        if isinstance(self, keras.optimizers.LossScaleOptimizer):
            shard_grads = self._agree_finite(shard_grads)
        super().apply(shard_grads, runtime.shards)
        self._write_variables(present)
        return None

    def _write_variables(self, present):
        """Every bucket's updated shards allgathered (one hop) back into the model's variables."""
        runtime = self._zero()
        ps = self._collectives_settings.process_set
        values = [tf.convert_to_tensor(s.value) for s in runtime.shards]
        if _communicates(ps):
            values = raw.grouped_allgather(values, name=f"{_prefix(self)}.allgather", process_set=ps)
        for b, full in zip(runtime.buckets, values):
            for slot in b.slots:
                if present[slot.index]:
                    runtime.variables[slot.index].assign(
                        tf.reshape(full[slot.offset:slot.offset + slot.numel], slot.shape))

    def _accumulate_or_apply(self, full, present, passes):
        """backward_passes_per_step > 1: stage 1 accumulates whole gradients and reducescatters
        once per update; stage 2 reducescatters every pass and accumulates its shard."""
        runtime = self._zero()
        settings = self._collectives_settings
        if self._zero_stage == 1:
            pairs = [(g, acc) for g, acc in zip(full, runtime.accumulators) if g is not None]
        else:
            pairs = list(zip(self._reduce_scatter(full), runtime.accumulators))
        for g, acc in pairs:
            acc.assign_add(tf.cast(tf.convert_to_tensor(g), acc.dtype))
        count = runtime.counter.assign_add(1)

        def reduce_and_apply():
            summed = [acc.read_value() for acc in runtime.accumulators]
            if settings.average_aggregated_gradients:
                summed = [s / tf.cast(passes, s.dtype) for s in summed]
            if self._zero_stage == 1:
                summed = self._reduce_scatter([s if p else None for s, p in zip(summed, present)])
            self._apply_shards(summed, present)
            for acc in runtime.accumulators:
                acc.assign(tf.zeros_like(acc))
            runtime.counter.assign(0)
            return tf.constant(True)

        # Every rank takes the same branch (the counters agree), so the collectives inside are safe.
        return tf.cond(count >= passes, reduce_and_apply, lambda: tf.constant(False))

    # -- memory and checkpoints (keras_zero_checkpoint.py)

    def sharded_variables(self):
        """This rank's slices of the per-variable state (the rest, such as ``iterations``, every
        rank holds alike): what BroadcastGlobalVariablesCallback and elastic sync leave alone."""
        return list(keras_zero_checkpoint.split_variables(self)[0].values()) if self._zero().shards else []

    def shard_state_numel(self):
        """Elements of this rank's per-variable optimizer state (slots of the shards)."""
        return keras_zero_checkpoint.shard_state_numel(self)

    def consolidate(self, to=0):
        """Collective: on rank ``to`` of the process set, a plain optimizer of the wrapped class
        (same config), built on the model's variables and holding the whole state; None elsewhere."""
        return keras_zero_checkpoint.consolidate(self, to)

    def load_full(self, optimizer):
        """Load a plain optimizer's state (built on the same model's variables): each rank keeps its slices."""
        keras_zero_checkpoint.load_full(self, optimizer)

    def sharded_state_dict(self):
        """This rank's slices of the state and the layout (numpy arrays and plain values), for
        ``load_sharded_state_dict`` at any number of ranks (keras_zero_sharded.py)."""
        return keras_zero_sharded.sharded(self)

    def save_sharded_state_dict(self, directory):
        """Write this rank's ``sharded_state_dict()`` to ``directory`` (one file per rank); returns its path."""
        return keras_zero_sharded.write_file(self.sharded_state_dict(), os.fspath(directory))

    def load_sharded_state_dict(self, shards):
        """Every rank: load every rank's sharded state dicts (a list, or the directory
        ``save_sharded_state_dict`` wrote), saved at any number of ranks; each rank keeps its slices."""
        keras_zero_sharded.load_shards(self, shards)

    def gather_sharded_state_dicts(self, mine=None):
        """Collective: every rank's ``sharded_state_dict()`` (or ``mine``), in rank order, on every rank."""
        mine = self.sharded_state_dict() if mine is None else mine
        ps = self._collectives_settings.process_set
        if not _communicates(ps):
            return [mine]
        return objects.allgather_object(mine, name=f"{_prefix(self)}.gather_shards", process_set=ps)


def _refusal(optimizer, stage, settings):
    try:
        check_arguments(stage, settings.op, settings.gradient_predivide_factor, settings.backward_passes_per_step,
                        settings.groups is not None)
        check_optimizer(optimizer, stage)
    except Exception as e:  # noqa: BLE001 - shared with the other ranks before it is raised
        return e
    return None


def wrap(optimizer, settings, stage, serialize_as):
    """The sharded wrapper of a Keras 3 optimizer (module docstring). Collective: every rank of the
    set wraps, and a refusal on any rank raises on every rank."""
    import keras

    loss_scale = keras.optimizers.LossScaleOptimizer
    if keras.config.dtype_policy().name == "mixed_float16" and not isinstance(optimizer, loss_scale):
        optimizer = loss_scale(optimizer)
    problem = _refusal(optimizer, stage, settings)
    if _communicates(settings.process_set):
        agree(problem, None, settings.process_set, stage, name=f"{_base_name(settings, stage)}.refusals")
    elif problem is not None:
        raise problem
    attrs = {"_collectives_settings": settings, "_zero_stage": stage}
    base = type(optimizer)
    cls = type(base.__name__, (_ZeroOptimizer, base),
               dict(attrs, __module__=base.__module__, __qualname__=base.__qualname__))
    serialize_as(base, cls)
    if isinstance(optimizer, loss_scale):
        inner = optimizer.inner_optimizer
        inner_base = type(inner)
        inner_cls = type(inner_base.__name__, (_ShardClipping, inner_base),
                         dict(attrs, __module__=inner_base.__module__, __qualname__=inner_base.__qualname__))
        serialize_as(inner_base, inner_cls)
        config = {k: v for k, v in optimizer.get_config().items() if k != "inner_optimizer"}
        wrapped = cls(inner_cls.from_config(inner.get_config()), **config)
    else:
        wrapped = cls.from_config(optimizer.get_config())
    if optimizer.built:  # carry the state of an optimizer that has already stepped
        source = optimizer.inner_optimizer if isinstance(optimizer, loss_scale) else optimizer
        wrapped.build(source._trainable_variables)
        wrapped.load_full(optimizer)
    return wrapped
