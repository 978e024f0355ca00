"""collectives: Horovod-style collective communication for data-parallel training.

``import collectives as hvd`` gives the framework-agnostic face: the collective verbs on numpy
arrays and any CPU array (DLPack or buffer protocol), returning the caller's type. Importing
this package loads neither MPI nor any framework; ``init()`` starts the engine.
"""
from .basics import (
    cross_rank,
    cross_size,
    cuda_built,
    gloo_built,
    gloo_enabled,
    init,
    is_initialized,
    local_rank,
    local_size,
    mpi_built,
    mpi_enabled,
    mpi_threads_supported,
    nccl_built,
    rank,
    rocm_built,
    shutdown,
    size,
    start_timeline,
    stop_timeline,
)
from .constants import Adasum, Average, Max, Min, Product, ReduceOp, Sum
from .errors import (
    CollectivesError,
    DuplicateNameError,
    InternalError,
    InvalidArgumentError,
    NotInitializedError,
    ShutdownError,
    StallTimeoutError,
    TensorMismatchError,
    UnsupportedTypeError,
)
from .handles import Handle, poll, synchronize
from .objects import allgather_object, broadcast_object
from .process_sets import ProcessSet, add_process_set, global_process_set, remove_process_set
from .ops import (
    allgather,
    allgather_async,
    allreduce,
    allreduce_,
    allreduce_async,
    allreduce_async_,
    alltoall,
    alltoall_async,
    barrier,
    broadcast,
    broadcast_,
    broadcast_async,
    broadcast_async_,
    grouped_allgather,
    grouped_allgather_async,
    grouped_allreduce,
    grouped_allreduce_,
    grouped_allreduce_async,
    grouped_allreduce_async_,
    grouped_reducescatter,
    grouped_reducescatter_async,
    join,
    reducescatter,
    reducescatter_async,
)

__version__ = "0.1.0"
