"""``horovod.tensorflow.compression`` of ``collectives.tensorflow``: ``Compression``,
``Compressor``, ``NoneCompressor`` and ``FP16Compressor`` (and our ``BF16Compressor``),
implemented in ``collectives.adapters.tensorflow.compression``."""
from collectives.adapters.tensorflow.compression import (
    BF16Compressor,
    Compression,
    Compressor,
    FP16Compressor,
    NoneCompressor,
)

__all__ = ["Compression", "Compressor", "NoneCompressor", "FP16Compressor", "BF16Compressor"]
