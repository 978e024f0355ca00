"""``horovod.torch.sync_batch_norm`` of ``collectives.torch``: ``SyncBatchNorm`` and the names
Horovod 0.28.1's module imports publicly (``Sum``, ``allgather_async``, ``allreduce_async``,
``size``, ``synchronize``)."""
from collectives.adapters.torch.mpi_ops import allgather_async, allreduce_async, synchronize
from collectives.adapters.torch.sync_batch_norm import SyncBatchNorm
from collectives.basics import size
from collectives.constants import Sum

__all__ = ["SyncBatchNorm", "Sum", "allgather_async", "allreduce_async", "size", "synchronize"]
