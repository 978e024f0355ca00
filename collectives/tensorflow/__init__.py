"""``import collectives.tensorflow as hvd``: a drop-in for ``horovod.tensorflow`` (TF2 API) on CPU.

The collectives take and return tf.Tensors (the input's dtype; eager tensors cross to the
engine without copies and results come back through DLPack), work eagerly and inside
``tf.function`` (not under XLA), and the differentiable ones carry gradients.
``DistributedGradientTape`` wraps a ``tf.GradientTape``; ``DistributedOptimizer`` wraps a
Keras 3 or Keras 2 (``tf_keras``) optimizer (as ``collectives.keras.DistributedOptimizer``); ``SyncBatchNormalization`` is
a Keras 3 layer with statistics over all ranks. TensorFlow 1 graphs (``tf.compat.v1``
sessions) are refused at graph-build time with ``GraphModeNotSupportedError``. The TensorFlow
glue lives in ``collectives.adapters.tensorflow``.
"""
# Horovod's mpi_ops names (basics, constants, process sets, the verbs it defines there): one
# list, in .mpi_ops; the rest of horovod.tensorflow's names follow.
from .mpi_ops import *  # noqa: F401,F403
from collectives.constants import ReduceOp  # noqa: F401
from collectives.errors import CollectivesError
from collectives.horovod_util import gpu_available, split_list  # noqa: F401  (horovod.common.util's)
from collectives.adapters.tensorflow.compression import Compression, Compressor  # noqa: F401
from collectives.adapters.tensorflow.hops import GraphModeNotSupportedError, XlaNotSupportedError  # noqa: F401
from collectives.adapters.tensorflow.keras_optimizer import tensorflow_distributed_optimizer as DistributedOptimizer  # noqa: F401,E501
from collectives.adapters.tensorflow import mpi_ops as _adapter
from collectives.adapters.tensorflow.mpi_ops import (  # noqa: F401
    _executing_eagerly,
    allgather_object,
    barrier,
    broadcast_global_variables,
    broadcast_object,
    broadcast_object_fn,
    broadcast_variables,
)
from collectives.adapters.tensorflow.tape import DistributedGradientTape, PartialDistributedGradientTape
from .mpi_ops import horovod_named

# Unnamed calls in a tf.function carry horovod.tensorflow's names (.mpi_ops.horovod_named).
allreduce = horovod_named(_adapter.allreduce, "Allreduce")
grouped_allreduce = horovod_named(_adapter.grouped_allreduce, "Allreduce", grouped=True)
reducescatter = horovod_named(_adapter.reducescatter, "Reducescatter")
grouped_reducescatter = horovod_named(_adapter.grouped_reducescatter, "Reducescatter", grouped=True)

# Horovod's name for errors raised by collective operations (a RuntimeError).
HorovodInternalError = CollectivesError

from . import elastic  # noqa: E402,F401  (hvd.elastic, as in Horovod)


# Horovod's submodules (hvd.mpi_ops, hvd.compression, hvd.functions; hvd.sync_batch_norm on first
# use, below), so ``from horovod.tensorflow.mpi_ops import ...`` ports by changing the import.
from . import compression, functions, mpi_ops  # noqa: E402,F401


def __getattr__(name):
    # SyncBatchNormalization is a Keras layer: Keras is imported when it (or its module) is first
    # asked for, not by every ``import collectives.tensorflow``.
    if name == "SyncBatchNormalization":
        from collectives.adapters.tensorflow.sync_batch_norm import SyncBatchNormalization
        return SyncBatchNormalization
    if name == "sync_batch_norm":
        import importlib

        return importlib.import_module(f"{__name__}.sync_batch_norm")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
