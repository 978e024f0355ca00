"""``horovod.tensorflow.sync_batch_norm`` of ``collectives.tensorflow``: the Keras 3 layer
``SyncBatchNormalization`` and the names Horovod 0.28.1's module imports publicly. Importing
this module imports Keras (``import collectives.tensorflow`` alone does not)."""
from collectives.adapters.tensorflow.sync_batch_norm import SyncBatchNormalization
from collectives.basics import rank, size
from collectives.constants import Sum

__all__ = ["SyncBatchNormalization", "Sum", "rank", "size"]
