"""Gradient compression for allreduce, as in horovod.tensorflow.compression (the logic lives
in collectives.compression; this gives it TensorFlow's dtypes and cast)."""
import tensorflow as tf

from collectives.compression import CastCompressor, Compressor, NoneCompressor  # noqa: F401 - re-exported


class _TensorFlowCast(CastCompressor):
    is_float = staticmethod(lambda dtype: dtype.is_floating)
    cast = staticmethod(lambda tensor, dtype: tf.cast(tensor, dtype))


class FP16Compressor(_TensorFlowCast):
    """Floating-point tensors travel as float16."""

    wire_dtype = tf.float16


class BF16Compressor(_TensorFlowCast):
    """Floating-point tensors travel as bfloat16 (float32's range, fewer mantissa bits)."""

    wire_dtype = tf.bfloat16


class Compression:
    """``Compression.none``, ``Compression.fp16``, ``Compression.bf16``."""

    none = NoneCompressor
    fp16 = FP16Compressor
    bf16 = BF16Compressor
