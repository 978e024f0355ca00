"""Array plumbing: dtypes, aligned allocation, and turning inputs into numpy views and
results back into the caller's type (numpy, DLPack producers, buffer-protocol objects)."""
import array as _array

import numpy as np

from .constants import DataType
from .errors import UnsupportedTypeError

_NUMPY_DTYPES = {
    np.dtype(np.uint8): DataType.UINT8,
    np.dtype(np.int8): DataType.INT8,
    np.dtype(np.int16): DataType.INT16,
    np.dtype(np.int32): DataType.INT32,
    np.dtype(np.int64): DataType.INT64,
    np.dtype(np.float16): DataType.FLOAT16,
    np.dtype(np.float32): DataType.FLOAT32,
    np.dtype(np.float64): DataType.FLOAT64,
    np.dtype(np.bool_): DataType.BOOL,
}



def engine_dtype(dtype):
    """The engine's DataType for a numpy dtype; UnsupportedTypeError otherwise."""
    dtype = np.dtype(dtype)
    found = _NUMPY_DTYPES.get(dtype)
    if found is not None:
        return found
    if dtype.name == "bfloat16":  # ml_dtypes.bfloat16, numpy's stand-in used by TF and JAX
        return DataType.BFLOAT16
    raise UnsupportedTypeError(
        f"collectives does not support dtype {dtype}; supported: uint8, int8, int16, int32, int64, "
        "float16, bfloat16, float32, float64, bool"
    )


def aligned_empty(shape, dtype):
    """An uninitialized C-contiguous array whose data starts on a 64-byte boundary."""
    from ._loader import engine_module

    return engine_module().aligned_empty([int(d) for d in shape], np.dtype(dtype))


def from_engine_buffer(buffer, shape, dtype):
    """A numpy view (no copy) of an engine-allocated output."""
    return np.frombuffer(buffer, dtype=np.uint8, count=buffer.nbytes).view(np.dtype(dtype)).reshape(tuple(shape))


class Converted:
    """An input seen as numpy: ``view`` is the user's memory, ``array`` a C-contiguous
    version of it (the same object when the view already is contiguous)."""

    __slots__ = ("view", "array", "original")

    def __init__(self, x):
        self.original = x
        self.view = as_numpy(x)
        engine_dtype(self.view.dtype)  # reject unsupported dtypes before anything else
        # np.ascontiguousarray would turn 0-d arrays into 1-d ones.
        view = self.view
        self.array = view if view.flags.c_contiguous else np.array(view, order="C", copy=True)

    def wrap(self, result):
        """Give a numpy result back in the type the user passed."""
        return to_caller_type(result, self.original)

    def wrap_index(self, result):
        """Auxiliary integer results (alltoall's received splits): a tensor of the caller's
        framework for DLPack producers, numpy otherwise (a bytearray of int32 bytes would be
        meaningless)."""
        if isinstance(self.original, np.ndarray) or not hasattr(self.original, "__dlpack__"):
            return result
        return to_caller_type(result, self.original)


def as_numpy(x):
    """View ``x`` as numpy without copying where possible."""
    if isinstance(x, np.ndarray):
        return x
    if hasattr(x, "__dlpack__"):
        return np.from_dlpack(x)
    if isinstance(x, (bytes, bytearray, memoryview, _array.array)):
        return np.asarray(memoryview(x))
    if isinstance(x, (np.generic, int, float, bool)):
        return np.asarray(x)
    raise UnsupportedTypeError(
        f"collectives cannot use a {type(x).__module__}.{type(x).__name__}: pass a numpy array, "
        "a tensor (DLPack) or a buffer-protocol object"
    )


def to_caller_type(result, original):
    """numpy for numpy (and scalars); the producer's type for DLPack objects; the same
    container type for buffer-protocol objects."""
    if isinstance(original, np.ndarray) or isinstance(original, (np.generic, int, float, bool)):
        return result
    if isinstance(original, bytearray):
        return bytearray(result.tobytes())
    if isinstance(original, bytes):
        return result.tobytes()
    if isinstance(original, _array.array):
        return _array.array(original.typecode, result.tobytes())
    if isinstance(original, memoryview):
        return memoryview(result)
    from_dlpack = _dlpack_importer(original)
    if from_dlpack is not None:
        return from_dlpack(result)
    return result


_IMPORTERS = {}


def register_dlpack_importer(module_name, importer):
    """Adapters register how their framework builds a tensor from a numpy result."""
    _IMPORTERS[module_name] = importer


def _dlpack_importer(obj):
    top = type(obj).__module__.split(".")[0]
    if top in _IMPORTERS:
        return _IMPORTERS[top]
    if top == "numpy":
        return None
    try:
        module = __import__(top)
    except ImportError:
        return None
    importer = getattr(module, "from_dlpack", None)
    if importer is not None:
        _IMPORTERS[top] = importer
    return importer
