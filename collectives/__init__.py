"""collectives: Horovod-style collective communication for data-parallel training.

``import collectives as hvd`` gives the framework-agnostic face: the collective verbs on numpy
arrays, torch tensors, TensorFlow tensors and any CPU array (DLPack or buffer protocol),
returning the caller's type; ``DistributedOptimizer`` for a torch or a Keras optimizer.
Importing this package loads neither MPI nor any framework; ``init()`` starts the engine.
"""
from .basics import *  # noqa: F401,F403  (basics.__all__: rank, size, init, ... as every face has them)
from .absent_backends import ccl_built, ddl_built
from .constants import Adasum, Average, Max, Min, Product, ReduceOp, Sum
from .errors import (
    ArgumentTypeError,
    CollectivesError,
    DuplicateNameError,
    InternalError,
    InvalidArgumentError,
    NotInitializedError,
    NotSupportedError,
    ShutdownError,
    StallTimeoutError,
    TensorMismatchError,
    UnregisteredProcessSetError,
    UnsupportedTypeError,
)
from .handles import Handle
from .objects import allgather_object, broadcast_object
from .ops import barrier, join
from .process_sets import ProcessSet, add_process_set, global_process_set, remove_process_set
from .dispatch import (
    DistributedOptimizer,
    broadcast_optimizer_state,
    broadcast_parameters,
    broadcast_variables,
    framework_of,
    poll,
    synchronize,
)
from .dispatch import VERBS as _VERBS

# The collective verbs, dispatched by the type of their tensor argument (see dispatch.py).
allreduce = _VERBS["allreduce"]
allreduce_ = _VERBS["allreduce_"]
allreduce_async = _VERBS["allreduce_async"]
allreduce_async_ = _VERBS["allreduce_async_"]
grouped_allreduce = _VERBS["grouped_allreduce"]
grouped_allreduce_ = _VERBS["grouped_allreduce_"]
grouped_allreduce_async = _VERBS["grouped_allreduce_async"]
grouped_allreduce_async_ = _VERBS["grouped_allreduce_async_"]
broadcast = _VERBS["broadcast"]
broadcast_ = _VERBS["broadcast_"]
broadcast_async = _VERBS["broadcast_async"]
broadcast_async_ = _VERBS["broadcast_async_"]
allgather = _VERBS["allgather"]
allgather_async = _VERBS["allgather_async"]
grouped_allgather = _VERBS["grouped_allgather"]
grouped_allgather_async = _VERBS["grouped_allgather_async"]
alltoall = _VERBS["alltoall"]
alltoall_async = _VERBS["alltoall_async"]
reducescatter = _VERBS["reducescatter"]
reducescatter_async = _VERBS["reducescatter_async"]
grouped_reducescatter = _VERBS["grouped_reducescatter"]
grouped_reducescatter_async = _VERBS["grouped_reducescatter_async"]

__version__ = "0.1.0"


def run(func, *args, **kwargs):
    """Horovod's ``horovod.run``: ``func`` on ``np`` ranks, the list of their return values
    (collectives/launcher/function_runner.py)."""
    from .launcher.function_runner import run as run_function

    return run_function(func, *args, **kwargs)
