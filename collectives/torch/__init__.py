"""``import collectives.torch as hvd``: a drop-in for ``horovod.torch`` on CPU tensors.

The collective verbs take and return ``torch.Tensor`` (the input's dtype; contiguous CPU
tensors cross to the engine without copies), the non-in-place ones are differentiable, and
the ``*_async`` ones return handles for ``poll`` / ``synchronize``. The torch glue lives in
``collectives.adapters.torch``.
"""
# Horovod's mpi_ops names (the verbs, basics, constants, ProcessSet, HorovodInternalError): one
# list, in .mpi_ops; the rest of horovod.torch's names follow.
from .mpi_ops import *  # noqa: F401,F403
from .mpi_ops import HorovodInternalError  # noqa: F401
from collectives.constants import ReduceOp  # noqa: F401
from collectives.errors import CollectivesError  # noqa: F401
from collectives.adapters.torch.compression import Compressor  # noqa: F401
from collectives.adapters.torch.mpi_ops import allgather_object, broadcast_object  # noqa: F401
from collectives.adapters.torch.sync_batch_norm import SyncBatchNorm

try:
    from .optimizer import DistributedOptimizer, broadcast_optimizer_state, broadcast_parameters  # noqa: F401
except ImportError as _error:  # the optimizer face is written separately; drop this guard once it exists
    if getattr(_error, "name", None) != f"{__name__}.optimizer":
        raise

from . import elastic  # noqa: E402,F401  (hvd.elastic, as in Horovod)

# Horovod's submodules (hvd.mpi_ops, hvd.compression, hvd.functions, hvd.sync_batch_norm), so
# ``from horovod.torch.mpi_ops import ...`` ports by changing the import. They import the layers
# below, not this package.
from . import compression, functions, mpi_ops, sync_batch_norm  # noqa: E402,F401
