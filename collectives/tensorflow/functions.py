"""``horovod.tensorflow.functions`` of ``collectives.tensorflow``: ``broadcast_variables``,
``broadcast_object``, ``broadcast_object_fn``, ``allgather_object`` and the names Horovod
0.28.1's module imports publicly."""
from collectives.adapters.tensorflow.mpi_ops import (
    allgather_object,
    broadcast_,
    broadcast_object,
    broadcast_object_fn,
    broadcast_variables,
)
from collectives.adapters.tensorflow.process_sets import ProcessSet, global_process_set
from collectives.basics import rank, size

from .mpi_ops import allgather, broadcast  # the face's: they carry Horovod's names

__all__ = ["broadcast_variables", "broadcast_object", "broadcast_object_fn", "allgather_object", "ProcessSet",
           "global_process_set", "allgather", "broadcast", "broadcast_", "rank", "size"]
