"""Horovod's optimizer names for PyTorch: ``DistributedOptimizer``, ``broadcast_parameters``,
``broadcast_optimizer_state`` (implemented in ``collectives.adapters.torch.optimizer``)."""
from collectives.adapters.torch.compression import Compression
from collectives.adapters.torch.optimizer import (
    DistributedOptimizer,
    broadcast_optimizer_state,
    broadcast_parameters,
)

__all__ = ["DistributedOptimizer", "broadcast_parameters", "broadcast_optimizer_state", "Compression"]
