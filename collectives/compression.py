"""Gradient compression, as in Horovod's ``Compression``: floating-point tensors travel in a
narrower type and are cast back afterwards. The logic is the same for every framework; each
adapter supplies only how to recognise and cast its tensors (``is_float``, ``cast``) and its
wire dtypes."""


class Compressor:
    """Interface: ``compress(tensor) -> (tensor, ctx)``, ``decompress(tensor, ctx) -> tensor``."""

    @staticmethod
    def compress(tensor):
        raise NotImplementedError

    @staticmethod
    def decompress(tensor, ctx):
        raise NotImplementedError


class NoneCompressor(Compressor):
    """No compression."""

    @staticmethod
    def compress(tensor):
        return tensor, None

    @staticmethod
    def decompress(tensor, ctx):
        return tensor


class CastCompressor(Compressor):
    """Floating-point tensors travel as ``wire_dtype``; others pass through. Subclasses set
    ``wire_dtype`` and the framework's ``is_float(dtype)`` and ``cast(tensor, dtype)``."""

    wire_dtype = None

    @staticmethod
    def is_float(dtype):
        raise NotImplementedError

    @staticmethod
    def cast(tensor, dtype):
        raise NotImplementedError

    @classmethod
    def compress(cls, tensor):
        # ctx is the input's dtype whatever it is, as Horovod's (code that inspects ctx sees the
        # same value); only floating-point tensors are cast.
        if cls.is_float(tensor.dtype) and tensor.dtype != cls.wire_dtype:
            return cls.cast(tensor, cls.wire_dtype), tensor.dtype
        return tensor, tensor.dtype

    @classmethod
    def decompress(cls, tensor, ctx):
        # ctx None: a ctx from before ctx was always the dtype (or a caller's own); integers
        # were never cast, and a tensor already of its dtype needs no cast.
        if ctx is None or not cls.is_float(ctx) or tensor.dtype == ctx:
            return tensor
        return cls.cast(tensor, ctx)
