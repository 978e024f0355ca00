"""``import collectives.keras as hvd``: horovod.tensorflow.keras's names for Keras 3 (TensorFlow
backend) and Keras 2 (``tf_keras``, e.g. ``tf.keras`` under ``TF_USE_LEGACY_KERAS=1``).

``DistributedOptimizer`` wraps a Keras optimizer of either Keras (the optimizer's class says
which) for ``model.fit`` and custom loops (a saved model loads with plain Keras); ``callbacks``
holds BroadcastGlobalVariablesCallback, MetricAverageCallback, LearningRateScheduleCallback,
LearningRateWarmupCallback and BestModelCheckpoint, which serve either Keras' ``fit``.
"""
from collectives.basics import *  # noqa: F401,F403  (basics.__all__: rank, size, init, ... as every face has them)
from collectives.absent_backends import ccl_built, ddl_built
from collectives.constants import Adasum, Average, Max, Min, Product, ReduceOp, Sum
from collectives.errors import CollectivesError
from collectives.horovod_util import is_version_greater_equal_than  # noqa: F401  (horovod.common.util's)
from collectives.adapters.tensorflow.compression import Compression
from collectives.adapters.tensorflow.keras_ops import allgather, allreduce, broadcast, load_model, reducescatter
from collectives.adapters.tensorflow.keras_optimizer import DistributedOptimizer, PartialDistributedOptimizer
from collectives.adapters.tensorflow.mpi_ops import (
    allgather_object,
    barrier,
    broadcast_global_variables,
    broadcast_object,
    broadcast_variables,
    join,
)
from collectives.adapters.tensorflow.process_sets import (
    ProcessSet,
    add_process_set,
    global_process_set,
    remove_process_set,
)

from . import callbacks  # noqa: E402  (collectives.keras.callbacks, as in Horovod)

HorovodInternalError = CollectivesError

from . import elastic  # noqa: E402,F401  (hvd.elastic, as in Horovod)
