"""The common allreduce call, prepared with type tests instead of the general checks.

A small allreduce spends most of its Python time on argument handling that, for the usual
call -- a C-contiguous numpy array of a supported dtype, a ReduceOp (or int) op, int or float
scale factors, the global process set -- can only succeed. ``spec_or_none`` recognises that
call by exact types (``type(x) is ...``, so bools, numpy scalars and subclasses take the general
path, whose checks and error messages stay the only ones) and builds the engine submission
directly; anything else returns None and goes through ``ops._allreduce_prepare``.
"""
import math

import numpy as np

from .arrays import aligned_empty, engine_dtype
from .constants import OpType, ReduceOp
from .process_set_registry import global_process_set

# Outputs up to this size come from numpy's allocator (cheaper than the engine's aligned
# buffers); larger ones from the engine's buffer pool, whose reused mappings are already
# faulted in (a fresh 16 MiB array costs about a millisecond of page faults).
_SMALL_OUTPUT_BYTES = 64 * 1024

_dtype_codes = {}  # numpy dtype -> engine DataType (int), for dtypes seen and supported
_SCALARS = (float, int)
_MAX_OP = max(ReduceOp)
_ALLREDUCE = int(OpType.ALLREDUCE)


def _dtype_code(dtype):
    code = _dtype_codes.get(dtype)
    if code is None:
        try:
            code = int(engine_dtype(dtype))
        except Exception:  # noqa: BLE001 - unsupported: the general path raises the typed error
            return None
        _dtype_codes[dtype] = code
    return code


def output_for(tensor):
    """An uninitialized array like ``tensor`` for an out-of-place result. Small ones are not
    64-byte aligned; the TensorFlow adapter copies such a result into an aligned buffer before
    handing it to TensorFlow (adapters/tensorflow/tensors.py), which costs what allocating it
    aligned here would."""
    if tensor.nbytes <= _SMALL_OUTPUT_BYTES:
        return np.empty(tensor.shape, tensor.dtype)
    return aligned_empty(tensor.shape, tensor.dtype)


def spec_or_none(tensor, op, name, prescale_factor, postscale_factor, process_set, inplace, group="", group_size=0):
    """(spec, out) for the engine, or None when the call is not the common case. ``name`` is
    the request name already resolved (arguments.name); ``group``/``group_size`` name a grouped
    allreduce's group (ops._grouped_async), already resolved too."""
    if type(tensor) is not np.ndarray or (process_set is not global_process_set and process_set is not None):
        return None
    flags = tensor.flags
    if not flags.c_contiguous or (inplace and not flags.writeable):
        return None
    code = _dtype_code(tensor.dtype)
    if code is None:
        return None
    if op is None:
        op = 0  # Average
    elif (type(op) is not ReduceOp and type(op) is not int) or not 0 <= op <= _MAX_OP:
        return None
    if type(prescale_factor) not in _SCALARS or type(postscale_factor) not in _SCALARS:
        return None
    prescale, postscale = float(prescale_factor), float(postscale_factor)
    if not (math.isfinite(prescale) and math.isfinite(postscale)):
        return None
    out = tensor if inplace else output_for(tensor)
    return (_ALLREDUCE, name, tensor, out, code, int(op), 0, prescale, postscale, [], group, group_size, 0), out
