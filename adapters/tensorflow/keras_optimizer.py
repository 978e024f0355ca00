"""horovod.tensorflow.keras's ``DistributedOptimizer``: the Keras 3 wrapper, and the choice of
wrapper by the optimizer's Keras (keras_flavors.py; Keras 2's is in keras2_optimizer.py).

Keras 3 routes every update through ``optimizer.apply(grads, variables)``: ``model.fit``'s
train step (``apply_gradients``), custom loops, and LossScaleOptimizer's inner call. The
wrapper is an object of a dynamic subclass of the user's optimizer class whose ``apply``
first combines the gradients over the ranks (one hop, one grouped request: see
``GradientReducer``), before the wrapped class clips them and updates the variables.

The subclass has the wrapped class's name and ``__module__``, adds nothing to its config,
and is serialized under the wrapped class's Keras name, so a model saved with it
(``model.save("m.keras")``) records the optimizer exactly as plain Keras would (e.g.
``keras.optimizers.Adam``) and loads with plain Keras in a process that never imports
collectives. The settings live on the dynamic class, so ``from_config`` (used to
build the wrapper, and by ``collectives.keras.load_model``) gives a configured instance.

``backward_passes_per_step=N`` accumulates gradients locally (in variables outside the
optimizer's own, so they are not saved) and reduces and applies them every N-th call;
the calls in between update nothing. ``optimizer.iterations`` counts updates, not calls:
that is what Keras 3's own ``gradient_accumulation_steps`` makes it count, and Adam's bias
correction and learning-rate schedules read it, so training matches one process that
accumulates the same micro-batches with Keras. (Horovod's Keras-2-era optimizer adds one on
every call, which advances those schedules ``backward_passes_per_step`` times per update.)

``register_local_var`` (and ``PartialDistributedOptimizer``'s ``local_layers``) keeps the
gradients of some variables local, as Horovod's (see ``GradientReducer``).
"""
import warnings

import tensorflow as tf

from collectives.constants import Adasum, Average
from collectives.errors import NotSupportedError

from . import keras2_optimizer, keras_zero_optimizer
from .compression import Compression
from .gradient_reducer import GradientReducer, check_groups
from .keras_flavors import FLAVORS, CollectivesOptimizer, Keras2, Keras3, flavor_of
from .process_sets import core_kwargs, global_process_set


class _Settings:
    """What DistributedOptimizer was asked for (kept on the dynamic class)."""

    def __init__(self, prefix, compression, op, gradient_predivide_factor, groups, sparse_as_dense, process_set,
                 backward_passes_per_step, average_aggregated_gradients, scale_local_gradients=True):
        self.prefix = prefix
        self.compression = compression
        self.op = op
        self.gradient_predivide_factor = gradient_predivide_factor
        self.groups = groups
        self.sparse_as_dense = sparse_as_dense
        self.process_set = process_set
        self.backward_passes_per_step = backward_passes_per_step
        self.average_aggregated_gradients = average_aggregated_gradients
        self.scale_local_gradients = scale_local_gradients

    def reducer(self, optimizer_name):
        """The GradientReducer of one wrapped optimizer (both Kerases' wrappers make theirs here)."""
        return GradientReducer(self.prefix or f"DistributedOptimizer.{optimizer_name}", self.compression, self.op,
                               self.gradient_predivide_factor, self.groups, self.sparse_as_dense, self.process_set,
                               self.scale_local_gradients)


class _Runtime:
    """Per-optimizer state that Keras must not track or save: the reducer and the local
    gradient accumulators (a plain object, so Keras' attribute tracking leaves it alone)."""

    def __init__(self, reducer):
        self.reducer = reducer
        self.accumulators = None  # one tf.Variable per trainable variable, for backward_passes_per_step > 1
        self.counter = None       # backward passes accumulated since the last update


class _DistributedOptimizer(CollectivesOptimizer):
    """Mixin placed before the Keras 3 optimizer class in a dynamic subclass."""

    _collectives_settings = None  # a _Settings, set on the dynamic class

    def _collectives_runtime(self):
        runtime = self.__dict__.get("_collectives_state")
        if runtime is None:
            runtime = _Runtime(self._collectives_settings.reducer(self.name))
            self.__dict__["_collectives_state"] = runtime
        return runtime

    def register_local_var(self, var):
        """Horovod's: gradients of ``var`` are not combined over the ranks; they are applied
        locally (divided by the number of ranks with ``scale_local_gradients``)."""
        self._collectives_runtime().reducer.register_local(var)

    def build(self, variables):
        super().build(variables)
        passes = self._collectives_settings.backward_passes_per_step
        runtime = self._collectives_runtime()
        if passes > 1 and runtime.accumulators is None:
            with tf.init_scope():  # plain variables, created eagerly even when build runs in a tf.function
                runtime.accumulators = [tf.Variable(tf.zeros(v.shape, v.dtype), trainable=False,
                                                    name="collectives_accumulator") for v in variables]
                runtime.counter = tf.Variable(0, dtype=tf.int64, trainable=False, name="collectives_passes")

    @tf.autograph.experimental.do_not_convert
    def apply(self, grads, trainable_variables=None):
        grads = list(grads)
        if trainable_variables is not None:
            trainable_variables = list(trainable_variables)
            if not self.built:
                self.build(trainable_variables)
                self.built = True
        variables = trainable_variables if trainable_variables is not None else self._trainable_variables
        settings = self._collectives_settings
        if settings.backward_passes_per_step == 1:
            reduced = self._collectives_runtime().reducer.reduce(grads, variables)
            return super().apply(reduced, trainable_variables)
        return self._accumulate_or_apply(grads, variables, trainable_variables, super().apply)

    def _accumulate_or_apply(self, grads, variables, trainable_variables, base_apply):
        settings = self._collectives_settings
        runtime = self._collectives_runtime()
        passes = settings.backward_passes_per_step
        accumulators = [runtime.accumulators[self._get_variable_index(v)] for v in variables]
        for g, acc in zip(grads, accumulators):
            if g is not None:
                acc.assign_add(tf.convert_to_tensor(g))
        count = runtime.counter.assign_add(1)

        def reduce_and_apply():
            present = [g is not None for g in grads]
            summed = [acc.read_value() if p else None for acc, p in zip(accumulators, present)]
            if settings.average_aggregated_gradients:
                summed = [s / tf.cast(passes, s.dtype) if s is not None else None for s in summed]
            base_apply(runtime.reducer.reduce(summed, variables), trainable_variables)
            for acc in accumulators:
                acc.assign(tf.zeros_like(acc))
            runtime.counter.assign(0)
            return tf.constant(True)

        # Every rank takes the same branch (the counters agree), so the reduction inside the
        # branch is safe; the passes in between only accumulate (iterations counts updates:
        # see the module docstring).
        return tf.cond(count >= passes, reduce_and_apply, lambda: tf.constant(False))


def _serialize_as(base, cls):
    """Make Keras write ``cls`` into saved configs exactly as it writes ``base``.

    Keras looks classes up by identity in two registries: public Keras classes
    (``keras.optimizers.Adam``) and classes registered with
    ``keras.saving.register_keras_serializable``. Entries for the dynamic subclass under the
    base's names make a saved model byte-for-byte what plain Keras would write, which loads
    anywhere. These registries are Keras internals: without them (another Keras version),
    the subclass is still saved under the base's module and class name, which plain Keras
    also loads, but not for registered custom optimizers.
    """
    try:
        from keras.src import api_export
        from keras.src.saving import object_registration
    except ImportError:  # pragma: no cover - a Keras without these modules
        return
    public = getattr(api_export, "REGISTERED_OBJS_TO_NAMES", {})
    if base in public:
        public[cls] = public[base]
    custom = getattr(object_registration, "GLOBAL_CUSTOM_NAMES", {})
    if base in custom:
        custom[cls] = custom[base]


def DistributedOptimizer(optimizer, name=None, device_dense="", device_sparse="", compression=Compression.none,
                         sparse_as_dense=False, gradient_predivide_factor=1.0, op=Average,
                         backward_passes_per_step=1, average_aggregated_gradients=False, num_groups=0, groups=None,
                         process_set=global_process_set, scale_local_gradients=True, zero_stage=0):
    """Wrap a Keras optimizer so that gradients are combined over all ranks before each update:
    a Keras 3 one (here) or a Keras 2 one, ``tf_keras.optimizers.*`` or ``.legacy.*``
    (keras2_optimizer.py), as the optimizer's class says.

    Returns a new optimizer of a dynamic subclass of ``optimizer``'s class, built from its
    config (and holding a copy of its state if it was already built). Arguments as in
    Horovod: ``compression`` (``Compression.none``/``fp16``/``bf16``), ``sparse_as_dense``,
    ``gradient_predivide_factor`` (Average only), ``op`` (Average, Sum, Min, Max, Product),
    ``backward_passes_per_step`` with ``average_aggregated_gradients``, ``groups`` (an int or
    lists of variables; by default one group), ``process_set`` (ranks outside it apply their
    local gradients).
    ``scale_local_gradients`` divides the gradients of variables registered with
    ``register_local_var`` by the number of ranks.
    ``name`` prefixes the engine's request names; ``device_*`` are accepted and ignored.

    Under the ``mixed_float16`` policy a plain optimizer is first wrapped in Keras'
    LossScaleOptimizer (what ``compile`` would do), so the reduction happens before the
    loss-scale optimizer checks the gradients for overflow: every rank then sees the same
    reduced gradients and takes the same branch.

    ``zero_stage=1`` or ``2`` (Keras 3) shards the optimizer state over the ranks of the process set
    (keras_zero_optimizer.py, docs/zero.md); construction is then collective.
    """
    del device_dense, device_sparse  # accepted for Horovod compatibility
    flavor = flavor_of(optimizer)
    if flavor is None:
        kinds = " or ".join(f.name for f in FLAVORS)
        raise ValueError(f"DistributedOptimizer wraps a Keras optimizer ({kinds}), not a {type(optimizer).__name__}")
    if isinstance(optimizer, CollectivesOptimizer):
        raise ValueError("optimizer is already a DistributedOptimizer")
    if zero_stage != 0 or isinstance(zero_stage, bool):
        return _zero(optimizer, flavor, zero_stage, name, compression, op, gradient_predivide_factor, num_groups,
                     groups, sparse_as_dense, process_set, backward_passes_per_step, average_aggregated_gradients)
    if op == Adasum:
        raise ValueError("op == Adasum is not supported yet with Keras")
    if gradient_predivide_factor != 1.0 and op != Average:
        raise ValueError("gradient_predivide_factor not supported with op != Average")
    if int(backward_passes_per_step) < 1:
        raise ValueError("backward_passes_per_step must be >= 1")
    if num_groups:
        warnings.warn("Parameter `num_groups` has been replaced by `groups` and will be removed in v0.23.0.",
                      DeprecationWarning, stacklevel=2)
        if groups is None:
            groups = num_groups
    check_groups(groups)
    core_kwargs(process_set)
    settings = _Settings(name, compression, op, float(gradient_predivide_factor), groups, sparse_as_dense,
                         process_set, int(backward_passes_per_step), bool(average_aggregated_gradients),
                         bool(scale_local_gradients))
    return _WRAPPERS[type(flavor)](optimizer, settings)


def _zero(optimizer, flavor, stage, name, compression, op, gradient_predivide_factor, num_groups, groups,
          sparse_as_dense, process_set, backward_passes_per_step, average_aggregated_gradients):
    """The sharded wrapper (keras_zero_optimizer.py); its checks raise on every rank of the set."""
    if not isinstance(flavor, Keras3):
        raise NotSupportedError(f"zero_stage={stage} is supported for Keras 3 optimizers only, not for "
                                f"{flavor.name}'s {type(optimizer).__name__}")
    core_kwargs(process_set)
    if num_groups and groups is None:
        groups = num_groups
    settings = _Settings(name, compression, op, float(gradient_predivide_factor), groups, sparse_as_dense,
                         process_set, int(backward_passes_per_step), bool(average_aggregated_gradients))
    return keras_zero_optimizer.wrap(optimizer, settings, stage, _serialize_as)


def _wrap_keras3(optimizer, settings):
    import keras

    loss_scale = keras.optimizers.LossScaleOptimizer
    if keras.config.dtype_policy().name == "mixed_float16" and not isinstance(optimizer, loss_scale):
        optimizer = loss_scale(optimizer)
    base = type(optimizer)
    cls = type(base.__name__, (_DistributedOptimizer, base),
               {"__module__": base.__module__, "__qualname__": base.__qualname__, "_collectives_settings": settings})
    _serialize_as(base, cls)
    wrapped = cls.from_config(optimizer.get_config())
    if optimizer.built:  # keep the state of an optimizer that has already stepped
        wrapped.build(optimizer._trainable_variables)
        for mine, theirs in zip(wrapped.variables, optimizer.variables):
            mine.assign(theirs)
    return wrapped


# How each Keras (keras_flavors.FLAVORS) is wrapped.
_WRAPPERS = {Keras3: _wrap_keras3, Keras2: keras2_optimizer.wrap}


def wrap_loaded_optimizer(optimizer, compression=Compression.none):
    """``load_model``'s wrapping: a Keras 2 optimizer becomes distributed in place, keeping its
    restored state (tf_keras may still be waiting to restore slots at the first step); a Keras
    3 one is wrapped with its state copied."""
    if isinstance(flavor_of(optimizer), Keras2):
        settings = _Settings(None, compression, Average, 1.0, None, False, global_process_set, 1, False)
        return keras2_optimizer.make_distributed_in_place(optimizer, settings)
    return DistributedOptimizer(optimizer, compression=compression)


def tensorflow_distributed_optimizer(optimizer, name=None, use_locking=False, device_dense="", device_sparse="",
                                     compression=Compression.none, sparse_as_dense=False, backward_passes_per_step=1,
                                     op=Average, gradient_predivide_factor=1.0, average_aggregated_gradients=False,
                                     num_groups=0, groups=None, process_set=global_process_set,
                                     scale_local_gradients=True, zero_stage=0):
    """``horovod.tensorflow.DistributedOptimizer``'s signature (TF2: Keras optimizers only; the
    TF1 ``tf.compat.v1.train.Optimizer`` is not supported). ``use_locking`` is ignored."""
    return DistributedOptimizer(optimizer, name=name, compression=compression, sparse_as_dense=sparse_as_dense,
                                gradient_predivide_factor=gradient_predivide_factor, op=op,
                                backward_passes_per_step=backward_passes_per_step,
                                average_aggregated_gradients=average_aggregated_gradients, num_groups=num_groups,
                                groups=groups, process_set=process_set, scale_local_gradients=scale_local_gradients,
                                zero_stage=zero_stage)


def PartialDistributedOptimizer(optimizer, name=None, device_dense="", device_sparse="",
                                compression=Compression.none, sparse_as_dense=False, gradient_predivide_factor=1.0,
                                op=Average, backward_passes_per_step=1, average_aggregated_gradients=False,
                                groups=None, process_set=global_process_set, local_layers=None,
                                scale_local_gradients=True):
    """Horovod's: a DistributedOptimizer whose ``local_layers`` (Keras layers) keep their
    gradients local; the other arguments are DistributedOptimizer's."""
    from .tape import local_layer_variables

    local = local_layer_variables(local_layers)
    wrapped = DistributedOptimizer(optimizer, name=name, compression=compression, sparse_as_dense=sparse_as_dense,
                                   gradient_predivide_factor=gradient_predivide_factor, op=op,
                                   backward_passes_per_step=backward_passes_per_step,
                                   average_aggregated_gradients=average_aggregated_gradients, groups=groups,
                                   process_set=process_set, scale_local_gradients=scale_local_gradients)
    for variable in local:
        wrapped.register_local_var(variable)
    return wrapped
