"""``DistributedOptimizer`` for Keras 2 (``tf_keras``): new-style ``tf_keras.optimizers.*`` and
the legacy ``tf_keras.optimizers.legacy.*`` (``OptimizerV2``).

The wrapper is an object of a dynamic subclass of the user's optimizer class (same name and
``__module__``, nothing added to its config, so a saved model records the optimizer as plain
tf_keras would). It combines the gradients over the ranks (one hop, one grouped request:
``GradientReducer``) wherever Keras 2 code gets or uses them:

* ``compute_gradients`` (new style) and ``_compute_gradients`` (legacy): what ``minimize``,
  hence ``model.fit``'s train step, calls; Horovod's Keras 2 wrapper hooks these;
* ``get_gradients`` (legacy; graph-mode Keras and TF1-style code);
* ``apply_gradients``, for custom loops that compute the gradients with their own tape.

Gradients that a hook has just reduced are not reduced again when ``apply_gradients`` gets them
for the same variables: ``minimize`` passes them straight on, and tf_keras' LossScaleOptimizer
passes them on unscaled (new tensors, so the check is by the variables, not the gradients: with
``op=Sum`` a second reduction would multiply them by the number of ranks). Gradients a custom
loop computed with its own tape are reduced there.

``backward_passes_per_step=N``: the gradient hooks return local gradients, and
``apply_gradients`` adds them to local accumulators and every N-th call reduces them and
updates (``iterations`` counts updates, as in the Keras 3 wrapper).
"""
import warnings

import tensorflow as tf

from .keras_flavors import CollectivesOptimizer, flavor_of


class _Runtime:
    """State Keras must not track or save (kept in ``__dict__``, out of Trackable's reach)."""

    def __init__(self, reducer):
        self.reducer = reducer
        self.just_reduced = None  # the variables whose gradients the last gradient hook reduced
        self.accumulators = {}    # variable.ref() -> local sum, for backward_passes_per_step > 1
        self.counter = None


class Keras2DistributedOptimizer(CollectivesOptimizer):
    """Mixin placed before the tf_keras optimizer class in a dynamic subclass."""

    _collectives_settings = None  # keras_optimizer._Settings, set on the dynamic class

    def _collectives_runtime(self):
        runtime = self.__dict__.get("_collectives_state")
        if runtime is None:
            runtime = _Runtime(self._collectives_settings.reducer(getattr(self, "name", None) or type(self).__name__))
            self.__dict__["_collectives_state"] = runtime
        return runtime

    def register_local_var(self, var):
        """Horovod's: gradients of ``var`` stay local (divided by the number of ranks with
        ``scale_local_gradients``)."""
        self._collectives_runtime().reducer.register_local(var)

    def _collectives_accumulating(self):
        return self._collectives_settings.backward_passes_per_step > 1

    def _collectives_reduce(self, grads, variables):
        runtime = self._collectives_runtime()
        reduced = runtime.reducer.reduce(list(grads), list(variables))
        runtime.just_reduced = list(variables)
        return reduced

    def _collectives_reduce_pairs(self, grads_and_vars):
        pairs = list(grads_and_vars)
        if self._collectives_accumulating() or not pairs:
            return pairs
        variables = [v for _, v in pairs]
        return list(zip(self._collectives_reduce([g for g, _ in pairs], variables), variables))

    # ------------------------------------------------------------ the gradient hooks

    @tf.autograph.experimental.do_not_convert
    def compute_gradients(self, loss, var_list, tape=None):
        return self._collectives_reduce_pairs(super().compute_gradients(loss, var_list, tape))

    @tf.autograph.experimental.do_not_convert
    def _compute_gradients(self, loss, var_list, grad_loss=None, tape=None):
        return self._collectives_reduce_pairs(super()._compute_gradients(loss, var_list, grad_loss=grad_loss,
                                                                         tape=tape))

    @tf.autograph.experimental.do_not_convert
    def get_gradients(self, loss, params):
        grads = super().get_gradients(loss, params)
        if self._collectives_accumulating():
            return grads
        return self._collectives_reduce(grads, params)

    def _collectives_already_reduced(self, variables):
        runtime = self._collectives_runtime()
        done, runtime.just_reduced = runtime.just_reduced, None
        return done is not None and len(done) == len(variables) and all(a is b for a, b in zip(done, variables))

    @tf.autograph.experimental.do_not_convert
    def apply_gradients(self, grads_and_vars, *args, **kwargs):
        pairs = list(grads_and_vars)
        grads, variables = [g for g, _ in pairs], [v for _, v in pairs]
        if self._collectives_accumulating():
            return self._collectives_accumulate_or_apply(grads, variables, args, kwargs)
        if not self._collectives_already_reduced(variables):
            grads = self._collectives_reduce(grads, variables)
            self._collectives_runtime().just_reduced = None
        return super().apply_gradients(list(zip(grads, variables)), *args, **kwargs)

    # ------------------------------------------------------------ backward_passes_per_step > 1

    def _collectives_accumulators(self, variables):
        runtime = self._collectives_runtime()
        with tf.init_scope():  # plain variables, created eagerly even inside a tf.function
            for v in variables:
                if v.ref() not in runtime.accumulators:
                    runtime.accumulators[v.ref()] = tf.Variable(tf.zeros(v.shape, v.dtype), trainable=False,
                                                                name="collectives_accumulator")
            if runtime.counter is None:
                runtime.counter = tf.Variable(0, dtype=tf.int64, trainable=False, name="collectives_passes")
        return [runtime.accumulators[v.ref()] for v in variables]

    def _collectives_accumulate_or_apply(self, grads, variables, args, kwargs):
        settings = self._collectives_settings
        runtime = self._collectives_runtime()
        passes = settings.backward_passes_per_step
        # The optimizer's own variables are created here, not inside the tf.cond branch below.
        flavor_of(self).build_optimizer(self, variables)
        accumulators = self._collectives_accumulators(variables)
        for g, acc in zip(grads, accumulators):
            if g is not None:
                acc.assign_add(tf.convert_to_tensor(g))
        count = runtime.counter.assign_add(1)
        base_apply = super().apply_gradients

        def reduce_and_apply():
            summed = [acc.read_value() if g is not None else None for acc, g in zip(accumulators, grads)]
            if settings.average_aggregated_gradients:
                summed = [s / tf.cast(passes, s.dtype) if s is not None else None for s in summed]
            base_apply(list(zip(runtime.reducer.reduce(summed, variables), variables)), *args, **kwargs)
            for acc in accumulators:
                acc.assign(tf.zeros_like(acc))
            runtime.counter.assign(0)
            return tf.constant(True)

        # Every rank takes the same branch (the counters agree): the reduction inside is safe.
        return tf.cond(count >= passes, reduce_and_apply, lambda: tf.constant(False))


def distributed_class(base, settings):
    """A dynamic subclass of tf_keras optimizer class ``base`` that reduces with ``settings``."""
    return type(base.__name__, (Keras2DistributedOptimizer, base),
                {"__module__": base.__module__, "__qualname__": base.__qualname__, "_collectives_settings": settings})


def wrap(optimizer, settings):
    """A new distributed optimizer built from ``optimizer``'s config (Horovod's way). An optimizer
    that has already stepped starts with fresh slots, as in Horovod (tf_keras keeps no list of
    the variables it was built for); ``load_model`` keeps the loaded state."""
    if flavor_of(optimizer).optimizer_built(optimizer):
        warnings.warn("collectives: DistributedOptimizer wraps a tf_keras optimizer that has already stepped; "
                      "the wrapper starts with fresh optimizer state (slots, iterations), as Horovod's does",
                      stacklevel=3)
    return distributed_class(type(optimizer), settings).from_config(optimizer.get_config())


def make_distributed_in_place(optimizer, settings):
    """Turn ``optimizer`` itself into a distributed optimizer, keeping its state and any
    restoration still pending (what ``load_model`` needs)."""
    optimizer.__class__ = distributed_class(type(optimizer), settings)
    return optimizer
