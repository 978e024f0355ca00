"""tf.Tensor <-> numpy for the engine, without copies where TensorFlow allows.

Into the engine: ``np.asarray(eager_tensor)`` is a read-only view of the tensor's memory
(``tensor.numpy()`` would copy). Out of the engine: results are 64-byte aligned numpy
arrays (``collectives.arrays.aligned_empty`` or engine-allocated outputs) and reach
TensorFlow through DLPack (``tf.experimental.dlpack.from_dlpack`` of the array's legacy
capsule), sharing the memory. TensorFlow accepts a DLPack buffer that is not 64-byte
aligned and then aborts the process at the first op on it, so alignment is checked here
and anything unaligned, read-only or strided is first copied into an aligned array.
numpy cannot export ml_dtypes.bfloat16 through DLPack: those go as uint16 and are
reinterpreted with ``tf.bitcast`` (which shares the buffer).
"""
import numpy as np
import tensorflow as tf

from collectives.arrays import aligned_empty
from collectives.errors import UnsupportedTypeError

ALIGNMENT = 64

SUPPORTED_DTYPES = (tf.uint8, tf.int8, tf.int16, tf.int32, tf.int64, tf.float16, tf.bfloat16, tf.float32,
                    tf.float64, tf.bool)


# Collectives that only move bytes (allgather, broadcast, alltoall) also take the unsigned
# types the engine has no dtype for: they travel as the signed type of the same width
# (Horovod registers uint16 for them; Keras keeps its random-seed state in uint32 variables).
BYTE_TWINS = {tf.uint16: tf.int16, tf.uint32: tf.int32, tf.uint64: tf.int64}


def check_dtype(dtype, what="collective"):
    dtype = tf.as_dtype(dtype)
    if dtype not in SUPPORTED_DTYPES:
        raise UnsupportedTypeError(
            f"{what}: collectives does not support dtype {dtype.name}; supported: uint8, int8, int16, int32, "
            "int64, float16, bfloat16, float32, float64, bool")
    return dtype


def as_tensor(value, what="collective", moves_bytes=False):
    """A tf.Tensor for ``value`` (tensors pass through; variables are read; numpy and Python
    values are converted), with its dtype checked. ``moves_bytes``: the collective only moves
    bytes, so the BYTE_TWINS types are accepted too."""
    tensor = value if isinstance(value, tf.Tensor) else tf.convert_to_tensor(value)
    if not (moves_bytes and tensor.dtype in BYTE_TWINS):
        check_dtype(tensor.dtype, what)
    return tensor


def to_wire(tensor):
    """``tensor`` as the engine can take it: BYTE_TWINS types bit-cast to their signed twin."""
    twin = BYTE_TWINS.get(tensor.dtype)
    return tensor if twin is None else tf.bitcast(tensor, twin)


def from_wire(tensor, dtype):
    """The result of a byte-moving collective back in the input's ``dtype``."""
    return tensor if tensor.dtype == dtype else tf.bitcast(tensor, dtype)


def to_numpy(tensor):
    """A numpy view of an eager tensor's memory (read-only, no copy on CPU)."""
    if tensor.shape.rank == 0:
        # TF 2.21's __array__ returns a numpy scalar, not an array, for 0-d bfloat16 tensors.
        return np.asarray(tf.reshape(tensor, [1])).reshape(())
    return np.asarray(tensor)


def _is_aligned(array):
    return array.ctypes.data % ALIGNMENT == 0


def to_tensor(array):
    """A tf.Tensor sharing ``array``'s memory when it is aligned, contiguous and writable
    (engine results are); otherwise a copy through an aligned buffer."""
    array = np.asarray(array)
    if not (array.flags.c_contiguous and array.flags.writeable and _is_aligned(array)):
        aligned = aligned_empty(array.shape, array.dtype)
        aligned[...] = array
        array = aligned
    return share(array)


# Compared as a dtype: reading ``dtype.name`` costs about 20 us a call.
_BFLOAT16 = np.dtype(tf.bfloat16.as_numpy_dtype)


def share(array):
    """A tf.Tensor borrowing ``array``'s memory, which the caller guarantees is C-contiguous,
    writable and 64-byte aligned (``to_tensor`` checks; a view into an aligned buffer at a
    64-byte offset, as gradient_buckets.py makes, needs no check)."""
    if array.dtype == _BFLOAT16:
        bits = tf.experimental.dlpack.from_dlpack(array.view(np.uint16).__dlpack__())
        return tf.bitcast(bits, tf.bfloat16)
    return tf.experimental.dlpack.from_dlpack(array.__dlpack__())
