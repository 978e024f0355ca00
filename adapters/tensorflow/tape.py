"""horovod.tensorflow's ``DistributedGradientTape``: a GradientTape whose ``gradient()``
returns the gradients combined over the ranks (averaged by default).

The tape the user recorded with is wrapped after the fact (``tape = DistributedGradientTape(tape)``)
or before (``with DistributedGradientTape(tf.GradientTape()) as tape``): the result is an
object of a dynamic subclass of the tape's class sharing its recorded state, so
``isinstance(tape, tf.GradientTape)`` holds and ``watch``/``stop_recording`` keep working.
All gradients of one ``gradient()`` call travel in one hop as one grouped request
(``GradientReducer``).
"""
import tensorflow as tf

from collectives.constants import Average

from .compression import Compression
from .gradient_reducer import GradientReducer
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


def DistributedGradientTape(gradtape, device_dense="", device_sparse="", compression=Compression.none,
                            sparse_as_dense=False, op=Average, gradient_predivide_factor=1.0, num_groups=0, groups=None,
                            process_set=global_process_set, scale_local_gradients=True):
    """Wrap a ``tf.GradientTape`` so that ``gradient()`` allreduces the gradients.

    Arguments as in Horovod: ``compression`` (``Compression.none``/``fp16``/``bf16``),
    ``sparse_as_dense`` (reduce ``tf.IndexedSlices`` as dense tensors instead of allgathering
    them), ``op`` (Average, Sum, Min, Max, Product), ``gradient_predivide_factor`` (Average
    only: scale by 1/f before the sum and f/size after), ``groups`` (an int, or lists of
    variables reduced together; by default all gradients form one group), ``process_set``
    (ranks outside it get their local gradients back). ``device_dense``/``device_sparse`` and
    ``scale_local_gradients`` (no local sources can be registered here) are accepted and ignored.
    """
    del device_dense, device_sparse, scale_local_gradients  # accepted for Horovod compatibility
    if num_groups and groups is None:
        groups = num_groups
    if not isinstance(gradtape, tf.GradientTape):
        raise ValueError(f"DistributedGradientTape wraps a tf.GradientTape, not a {type(gradtape).__name__}")
    base = type(gradtape)
    cls = type(base.__name__, (_DistributedGradientTape, base), {"__module__": base.__module__})
    tape = cls.__new__(cls)
    tape.__dict__.update(gradtape.__dict__)  # the recorded tape, persistence and watch settings
    tape._reducer = GradientReducer("DistributedGradientTape", compression, op, gradient_predivide_factor, groups,
                                    sparse_as_dense, process_set)
    return tape
