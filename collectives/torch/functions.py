"""``horovod.torch.functions`` of ``collectives.torch``: the public names of Horovod 0.28.1's
module (``broadcast_parameters``, ``broadcast_optimizer_state``, ``broadcast_object``,
``allgather_object`` and the verbs and process-set names it imports)."""
from collectives.adapters.torch.broadcasts import broadcast_optimizer_state, broadcast_parameters
from collectives.adapters.torch.mpi_ops import ProcessSet, allgather_object, broadcast_object, global_process_set
from collectives.adapters.torch.mpi_ops import synchronize

from .mpi_ops import allgather, broadcast_, broadcast_async_  # the face's: they carry Horovod's names
from collectives.basics import rank, size

__all__ = ["broadcast_parameters", "broadcast_optimizer_state", "broadcast_object", "allgather_object",
           "ProcessSet", "global_process_set", "allgather", "broadcast_", "broadcast_async_", "synchronize",
           "rank", "size"]
