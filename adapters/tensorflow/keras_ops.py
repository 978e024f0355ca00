"""horovod.tensorflow.keras's value functions (allreduce, allgather, broadcast, reducescatter
on anything convertible to a tensor) and ``load_model``."""
import tensorflow as tf

from collectives.constants import Average

from . import mpi_ops
from .compression import Compression
from .keras_flavors import flavor_of_saved_model
from .keras_optimizer import wrap_loaded_optimizer


@tf.autograph.experimental.do_not_convert
def allreduce(value, name=None, average=None, prescale_factor=1.0, postscale_factor=1.0, op=None,
              compression=Compression.none):
    """Reduce ``value`` (a tensor, variable, numpy array or number) over all ranks; Average by default."""
    return mpi_ops.allreduce(tf.convert_to_tensor(value), average=average, compression=compression, op=op,
                             prescale_factor=prescale_factor, postscale_factor=postscale_factor, name=name)


@tf.autograph.experimental.do_not_convert
def allgather(value, name=None):
    """Concatenate every rank's ``value`` along the first dimension."""
    return mpi_ops.allgather(tf.convert_to_tensor(value), name=name)


@tf.autograph.experimental.do_not_convert
def broadcast(value, root_rank, name=None):
    """``root_rank``'s ``value`` on every rank."""
    return mpi_ops.broadcast(tf.convert_to_tensor(value), root_rank, name=name)


@tf.autograph.experimental.do_not_convert
def reducescatter(value, name=None, op=Average):
    """Reduce ``value`` over all ranks; rank i keeps block i of the first dimension."""
    return mpi_ops.reducescatter(tf.convert_to_tensor(value), name=name, op=op)


@tf.autograph.experimental.do_not_convert
def load_model(filepath, custom_optimizers=None, custom_objects=None, compression=Compression.none,
               legacy_opts=False):
    """Load a saved Keras model and wrap its optimizer in DistributedOptimizer (keeping the
    optimizer's restored state), ready to continue training on every rank. The Keras that
    wrote the file (what it records; a SavedModel directory is Keras 2) loads it: Keras 3, or
    Keras 2 (tf_keras); a file that records none loads with tf_keras where Keras 2 is in use
    (``TF_USE_LEGACY_KERAS=1`` or tf_keras imported).

    ``custom_optimizers`` (optimizer classes) are merged into ``custom_objects`` by class name.
    ``legacy_opts`` (Horovod's switch to ``tf.keras.optimizers.legacy``) is accepted and
    ignored: the optimizer is the one the file records.
    """
    del legacy_opts
    objects = dict(custom_objects or {})
    for cls in custom_optimizers or []:
        objects.setdefault(cls.__name__, cls)
    model = flavor_of_saved_model(filepath).load_model(filepath, objects)
    if getattr(model, "optimizer", None) is not None:
        model.optimizer = wrap_loaded_optimizer(model.optimizer, compression=compression)
    return model
