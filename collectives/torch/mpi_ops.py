"""``horovod.torch.mpi_ops`` of ``collectives.torch``: the public names of Horovod 0.28.1's
module that collectives has, so ``from horovod.torch.mpi_ops import allreduce_async_`` ports
by changing the import. Not here: Horovod's autograd Function classes (``HorovodAllreduce``
and the like, whose ``apply`` signatures are Horovod's own) and its helpers ``mpi_lib``,
``check_installed_version``, ``num_rank_is_power_2`` and
``get_average_backwards_compatibility_fun``. ``gpu_available`` is here (Horovod's module imports
it from horovod.common.util), outside ``__all__``: horovod.torch itself does not export it.

It imports the layers below only (not ``collectives.torch``, which imports this module).
"""
from collectives.absent_backends import ccl_built, ddl_built
from collectives.adapters.torch.compression import Compression
from collectives.adapters.torch.mpi_ops import (
    ProcessSet,
    add_process_set,
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
    global_process_set,
    grouped_allgather,
    grouped_allgather_async,
    grouped_allreduce,
    grouped_allreduce_,
    grouped_allreduce_async,
    grouped_allreduce_async_,
    grouped_reducescatter,
    grouped_reducescatter_async,
    handle_average_backwards_compatibility,
    join,
    poll,
    reducescatter,
    reducescatter_async,
    remove_process_set,
    sparse_allreduce_async,
    synchronize,
)
from collectives.basics import *  # noqa: F401,F403  (basics.__all__: rank, size, init, ... as every face has them)
from collectives.constants import Adasum, Average, Max, Min, Product, Sum
from collectives.horovod_util import gpu_available  # noqa: F401
from collectives.renaming import kind_prefixed, renamed
from collectives.errors import CollectivesError

# Horovod's name for errors raised by collective operations (a RuntimeError).
HorovodInternalError = CollectivesError

# Requests carry horovod.torch's names (its timeline shows them): the op's kind before the given
# name, ``allreduce(x, name="a")`` is ``allreduce.a`` (collectives/renaming.py).
_KINDS = {
    "allreduce": ("allreduce", "allreduce_", "allreduce_async", "allreduce_async_"),
    "grouped_allreduce": ("grouped_allreduce", "grouped_allreduce_", "grouped_allreduce_async",
                          "grouped_allreduce_async_"),
    "allgather": ("allgather", "allgather_async", "sparse_allreduce_async"),  # sparse: two allgathers
    "grouped_allgather": ("grouped_allgather", "grouped_allgather_async"),
    "broadcast": ("broadcast", "broadcast_", "broadcast_async", "broadcast_async_"),
    "alltoall": ("alltoall", "alltoall_async"),
    "reducescatter": ("reducescatter", "reducescatter_async"),
    "grouped_reducescatter": ("grouped_reducescatter", "grouped_reducescatter_async"),
}
globals().update({verb: renamed(globals()[verb], kind_prefixed(kind)) for kind, verbs in _KINDS.items()
                  for verb in verbs})

__all__ = [
    "Adasum", "Average", "Compression", "HorovodInternalError", "Max", "Min", "ProcessSet", "Product", "Sum",
    "add_process_set", "allgather", "allgather_async", "allreduce", "allreduce_", "allreduce_async",
    "allreduce_async_", "alltoall", "alltoall_async", "barrier", "broadcast", "broadcast_", "broadcast_async",
    "broadcast_async_", "ccl_built", "cross_rank", "cross_size", "cuda_built", "ddl_built", "global_process_set",
    "gloo_built", "gloo_enabled", "grouped_allgather", "grouped_allgather_async", "grouped_allreduce",
    "grouped_allreduce_", "grouped_allreduce_async", "grouped_allreduce_async_", "grouped_reducescatter",
    "grouped_reducescatter_async", "handle_average_backwards_compatibility", "init", "is_homogeneous",
    "is_initialized", "join", "local_rank", "local_size", "mpi_built", "mpi_enabled", "mpi_threads_supported",
    "nccl_built", "poll", "rank", "reducescatter", "reducescatter_async", "remove_process_set", "rocm_built",
    "shutdown", "size", "sparse_allreduce_async", "start_timeline", "stop_timeline", "synchronize",
]
