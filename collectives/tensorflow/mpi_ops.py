"""``horovod.tensorflow.mpi_ops`` of ``collectives.tensorflow``: the public names of Horovod
0.28.1's module that collectives has, so ``from horovod.tensorflow.mpi_ops import allgather``
ports by changing the import. Not here: Horovod's private op wrappers (``_allreduce`` and the
like) and its build helpers (``load_library``, ``check_installed_version``, ...);
``gpu_available`` is here (Horovod's module imports it from horovod.common.util), outside
``__all__`` as it is no name of this module's own.

It imports the layers below only (not ``collectives.tensorflow``, which imports this module).
"""
from collectives.absent_backends import ccl_built, ddl_built
from collectives.adapters.tensorflow import mpi_ops as _adapter
from collectives.adapters.tensorflow.naming import horovod_graph_name
from collectives.adapters.tensorflow.mpi_ops import (
    broadcast_,
    join,
    local_rank_op,
    local_size_op,
    process_set_included_op,
    rank_op,
    size_op,
)
from collectives.adapters.tensorflow.process_sets import (
    ProcessSet,
    add_process_set,
    global_process_set,
    remove_process_set,
)
from collectives.basics import *  # noqa: F401,F403  (basics.__all__: rank, size, init, ... as every face has them)
from collectives.constants import Adasum, Average, Max, Min, Product, Sum
from collectives.horovod_util import gpu_available  # noqa: F401
from collectives.renaming import renamed


def horovod_named(verb, kind, grouped=False):
    """``verb`` naming unnamed calls in a tf.function as horovod.tensorflow's ops are named
    (adapters/tensorflow/naming.py); autograph leaves it alone, as the adapters' verbs."""
    return _adapter.not_converted(renamed(verb, horovod_graph_name(kind, grouped)))


allgather = horovod_named(_adapter.allgather, "Allgather")
grouped_allgather = horovod_named(_adapter.grouped_allgather, "Allgather", grouped=True)
broadcast = horovod_named(_adapter.broadcast, "Broadcast")
alltoall = horovod_named(_adapter.alltoall, "Alltoall")

__all__ = [
    "Adasum", "Average", "Max", "Min", "ProcessSet", "Product", "Sum", "add_process_set", "allgather", "alltoall",
    "broadcast", "broadcast_", "ccl_built", "cross_rank", "cross_size", "cuda_built", "ddl_built",
    "global_process_set", "gloo_built", "gloo_enabled", "grouped_allgather", "init", "is_homogeneous",
    "is_initialized", "join", "local_rank", "local_rank_op", "local_size", "local_size_op", "mpi_built",
    "mpi_enabled", "mpi_threads_supported", "nccl_built", "process_set_included_op", "rank", "rank_op",
    "remove_process_set", "rocm_built", "shutdown", "size", "size_op", "start_timeline", "stop_timeline",
]
