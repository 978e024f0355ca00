"""horovod.tensorflow's ``DistributedGradientTape``: a GradientTape whose ``gradient()``
returns the gradients combined over the ranks (averaged by default).

The tape the user recorded with is wrapped after the fact (``tape = DistributedGradientTape(tape)``)
or before (``with DistributedGradientTape(tf.GradientTape()) as tape``): the result is an
object of a dynamic subclass of the tape's class sharing its recorded state, so
``isinstance(tape, tf.GradientTape)`` holds and ``watch``/``stop_recording`` keep working.
All gradients of one ``gradient()`` call travel in one hop as one grouped request
(``GradientReducer``).
"""
import warnings

import tensorflow as tf

from collectives.constants import Average

from .compression import Compression
from .gradient_reducer import GradientReducer
from .keras_flavors import flavor_of
from .process_sets import global_process_set


class _DistributedGradientTape:
    """Mixin placed before the user's tape class in a dynamic subclass."""

    _reducer = None  # set per object by DistributedGradientTape

    @tf.autograph.experimental.do_not_convert
    def gradient(self, target, sources, output_gradients=None,
                 unconnected_gradients=tf.UnconnectedGradients.NONE):
        grads = super().gradient(target, sources, output_gradients, unconnected_gradients)
        # IndexedSlices and variables are leaves for tf.nest; None gradients stay in place.
        reduced = self._reducer.reduce(tf.nest.flatten(grads), tf.nest.flatten(sources))
        return tf.nest.pack_sequence_as(grads, reduced)

    def register_local_source(self, source):
        """Horovod's: gradients of ``source`` (a variable) are not combined over the ranks; they
        come back local (divided by the number of ranks with ``scale_local_gradients``)."""
        self._reducer.register_local(source)


def DistributedGradientTape(gradtape, device_dense="", device_sparse="", compression=Compression.none,
                            sparse_as_dense=False, op=Average, gradient_predivide_factor=1.0, num_groups=0, groups=None,
                            process_set=global_process_set, scale_local_gradients=True):
    """Wrap a ``tf.GradientTape`` so that ``gradient()`` allreduces the gradients.

    Arguments as in Horovod: ``compression`` (``Compression.none``/``fp16``/``bf16``),
    ``sparse_as_dense`` (reduce ``tf.IndexedSlices`` as dense tensors instead of allgathering
    them), ``op`` (Average, Sum, Min, Max, Product), ``gradient_predivide_factor`` (Average
    only: scale by 1/f before the sum and f/size after), ``groups`` (an int, or lists of
    variables reduced together; by default all gradients form one group), ``process_set``
    (ranks outside it get their local gradients back), ``scale_local_gradients`` (divide the
    gradients of sources registered with ``register_local_source`` by the number of ranks).
    ``device_dense``/``device_sparse`` are accepted and ignored.
    """
    del device_dense, device_sparse  # accepted for Horovod compatibility
    if num_groups:
        warnings.warn("Parameter `num_groups` has been replaced by `groups` and will be removed in v0.23.0.",
                      DeprecationWarning, stacklevel=2)
        if groups is None:
            groups = num_groups
    if not isinstance(gradtape, tf.GradientTape):
        raise ValueError(f"DistributedGradientTape wraps a tf.GradientTape, not a {type(gradtape).__name__}")
    base = type(gradtape)
    cls = type(base.__name__, (_DistributedGradientTape, base), {"__module__": base.__module__})
    tape = cls.__new__(cls)
    tape.__dict__.update(gradtape.__dict__)  # the recorded tape, persistence and watch settings
    tape._reducer = GradientReducer("DistributedGradientTape", compression, op, gradient_predivide_factor, groups,
                                    sparse_as_dense, process_set, scale_local_gradients)
    return tape


def local_layer_variables(local_layers):
    """The trainable variables of Horovod's ``local_layers`` argument (a Keras layer, a list of
    them, or None), of Keras 3 or Keras 2."""
    if local_layers is None:
        return []
    if flavor_of(local_layers, "layer") is not None:
        local_layers = [local_layers]
    local_layers = list(local_layers)
    if not all(flavor_of(layer, "layer") is not None for layer in local_layers):
        raise ValueError("All local layers must be of tf.keras.layers.Layer type.")
    return [v for layer in local_layers for v in layer.trainable_weights]


def PartialDistributedGradientTape(gradtape, device_dense="", device_sparse="", compression=Compression.none,
                                   sparse_as_dense=False, op=Average, gradient_predivide_factor=1.0, num_groups=0,
                                   groups=None, process_set=global_process_set, local_layers=None,
                                   scale_local_gradients=True):
    """A DistributedGradientTape whose ``local_layers`` (Keras layers) keep their gradients
    local, as Horovod's; the other arguments are DistributedGradientTape's."""
    local = local_layer_variables(local_layers)
    tape = DistributedGradientTape(gradtape, device_dense, device_sparse, compression, sparse_as_dense, op,
                                   gradient_predivide_factor, num_groups, groups, process_set, scale_local_gradients)
    for variable in local:
        tape.register_local_source(variable)
    return tape
