"""``horovod.torch.compression`` of ``collectives.torch``: ``Compression``, ``Compressor``,
``NoneCompressor`` and ``FP16Compressor`` (and our ``BF16Compressor``), implemented in
``collectives.adapters.torch.compression``."""
from collectives.adapters.torch.compression import (
    BF16Compressor,
    Compression,
    Compressor,
    FP16Compressor,
    NoneCompressor,
)

__all__ = ["Compression", "Compressor", "NoneCompressor", "FP16Compressor", "BF16Compressor"]
