"""Gradient compression for allreduce, as in horovod.torch.compression (the logic lives in
collectives.compression; this gives it torch's dtypes and cast)."""
import torch

from collectives.compression import CastCompressor, Compressor, NoneCompressor  # noqa: F401 - re-exported


class _TorchCast(CastCompressor):
    is_float = staticmethod(lambda dtype: dtype.is_floating_point)
    cast = staticmethod(lambda tensor, dtype: tensor.to(dtype))


class FP16Compressor(_TorchCast):
    """Floating-point tensors travel as float16."""

    wire_dtype = torch.float16


class BF16Compressor(_TorchCast):
    """Floating-point tensors travel as bfloat16 (float32's range, fewer mantissa bits)."""

    wire_dtype = torch.bfloat16


class Compression:
    """``Compression.none``, ``Compression.fp16``, ``Compression.bf16``."""

    none = NoneCompressor
    fp16 = FP16Compressor
    bf16 = BF16Compressor
