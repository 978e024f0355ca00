"""A request's second step for host arrays: the tensor as the engine sees it (a C-contiguous
numpy array of an engine dtype), its output, its engine Submission
(collectives/submissions.py) and how its outcome becomes the user's result.

Each function here takes the tensor and its request name, which the verb already resolved
(collectives/arguments.py), and returns ``(submission, finish, keep_alive)``: ``keep_alive`` holds
the objects whose memory the engine uses, and ``finish(outcomes, keep_alive)`` (one of the
functions at the end of this file) makes the user's result from them and the engine's outcomes
(a list of one: this submission's). No closure per request: a grouped allreduce makes one
request per tensor. Checks that fail raise typed errors
(collectives/arguments.py, collectives/arrays.py); the verb tells the other ranks
(collectives/shared_failure.py).

The common allreduce -- a C-contiguous numpy array of a supported dtype, a ReduceOp (or int)
op, int or float scale factors, the global process set -- can only succeed, and a small one
spends most of its Python time on argument handling. ``allreduce``'s first branch recognises
that call by exact types (``type(x) is ...``, so bools, numpy scalars and subclasses take the general
checks, whose error messages stay the only ones) and builds its Submission directly.
"""
import math
import numbers

import numpy as np

from . import arguments
from .arrays import Converted, aligned_empty, engine_dtype, from_engine_buffer
from .constants import OpType, ReduceOp
from .errors import InvalidArgumentError
from .process_set_registry import global_process_set, process_set_id, set_rank, set_size
from . import submissions

# Outputs up to this size come from numpy's allocator (cheaper than the engine's aligned
# buffers); larger ones from the engine's buffer pool, whose reused mappings are already
# faulted in (a fresh 16 MiB array costs about a millisecond of page faults).
_SMALL_OUTPUT_BYTES = 64 * 1024

_dtype_codes = {}  # numpy dtype -> engine DataType (int), for dtypes seen and supported
_SCALARS = (float, int)
_MAX_OP = max(ReduceOp)
_ALLREDUCE = int(OpType.ALLREDUCE)
_ndarray = np.ndarray


def _dtype_code(dtype):
    code = _dtype_codes.get(dtype)
    if code is None:
        try:
            code = int(engine_dtype(dtype))
        except Exception:  # noqa: BLE001 - unsupported: the general checks raise the typed error
            return None
        _dtype_codes[dtype] = code
    return code


def output_for(tensor):
    """An uninitialized array like ``tensor`` for an out-of-place allreduce. Small ones are not
    64-byte aligned; the TensorFlow adapter copies such a result into an aligned buffer before
    handing it to TensorFlow (adapters/tensorflow/tensors.py), which costs what allocating it
    aligned here would."""
    if tensor.nbytes <= _SMALL_OUTPUT_BYTES:
        return np.empty(tensor.shape, tensor.dtype)
    return aligned_empty(tensor.shape, tensor.dtype)


def _inplace_target(conv, what):
    """Where an in-place op writes: the user's memory, or a contiguous copy written back."""
    if isinstance(conv.original, (np.generic, numbers.Number)):
        raise InvalidArgumentError(f"{what} cannot modify a {type(conv.original).__name__} in place: Python and "
                                   "numpy scalars are immutable (use the verb without '_' and its result)")
    if not conv.view.flags.writeable:
        raise InvalidArgumentError(f"{what} needs a writable array")
    return conv.array if conv.array is conv.view else conv.array.copy()


def _reduction(op, name, arr, out, reduce_op, prescale, postscale, group, group_size, process_set):
    return submissions.submission(int(op), name, input=arr, output=out, dtype=int(engine_dtype(arr.dtype)),
                                  reduce_op=int(arguments.reduce_op(reduce_op)),
                                  prescale=arguments.scale_factor(prescale, "prescale_factor"),
                                  postscale=arguments.scale_factor(postscale, "postscale_factor"), group=group,
                                  group_size=int(group_size), process_set=process_set_id(process_set))


def allreduce(tensor, name, op, prescale, postscale, inplace, group="", group_size=0, process_set=None):
    # The common call first, its tests inline: a grouped allreduce runs this once per tensor.
    if type(tensor) is _ndarray and (process_set is global_process_set or process_set is None):
        flags = tensor.flags
        code = _dtype_code(tensor.dtype) if flags.c_contiguous and (flags.writeable or not inplace) else None
        if op is None:
            op = 0  # Average
        elif (type(op) is not ReduceOp and type(op) is not int) or not 0 <= op <= _MAX_OP:
            code = None
        if code is not None and type(prescale) in _SCALARS and type(postscale) in _SCALARS:
            pre, post = float(prescale), float(postscale)
            if math.isfinite(pre) and math.isfinite(post):
                out = tensor if inplace else output_for(tensor)
                sub = submissions.submission(_ALLREDUCE, name, input=tensor, output=out, dtype=code,
                                             reduce_op=int(op), prescale=pre, postscale=post, group=group,
                                             group_size=group_size)
                return sub, common_output, (tensor, out)
    conv = Converted(tensor)
    out = _inplace_target(conv, "allreduce_") if inplace else aligned_empty(conv.array.shape, conv.array.dtype)
    sub = _reduction(OpType.ALLREDUCE, name, out if inplace else conv.array, out, op, prescale, postscale, group,
                     group_size, process_set)
    return sub, _written_back if inplace else _converted_output, (conv, out)


def broadcast(tensor, name, root_rank, inplace, process_set=None):
    conv = Converted(tensor)
    out = _inplace_target(conv, "broadcast_") if inplace else aligned_empty(conv.array.shape, conv.array.dtype)
    arr = out if inplace else conv.array
    sub = submissions.submission(int(OpType.BROADCAST), name, input=arr, output=out,
                                 dtype=int(engine_dtype(arr.dtype)), root=arguments.root_rank(root_rank),
                                 process_set=process_set_id(process_set))
    return sub, _written_back if inplace else _converted_output, (conv, out)


def allgather(tensor, name, group="", group_size=0, process_set=None):
    conv = Converted(tensor)
    arr = conv.array if conv.array.ndim > 0 else conv.array.reshape(1)  # a scalar gathers as one row
    sub = submissions.submission(int(OpType.ALLGATHER), name, input=arr, dtype=int(engine_dtype(arr.dtype)),
                                 group=group, group_size=int(group_size), process_set=process_set_id(process_set))
    return sub, _gathered, (conv, arr)


def alltoall(tensor, name, splits, process_set=None):
    conv = Converted(tensor)
    sub = submissions.submission(int(OpType.ALLTOALL), name, input=conv.array,
                                 dtype=int(engine_dtype(conv.array.dtype)), splits=arguments.splits(splits),
                                 process_set=process_set_id(process_set))
    return sub, _exchanged, conv


def reducescatter(tensor, name, op, prescale, postscale, group="", group_size=0, process_set=None):
    conv = Converted(tensor)
    arr = conv.array
    if arr.ndim == 0:
        raise InvalidArgumentError(f"reducescatter needs a tensor with at least one dimension (tensor '{name}')")
    n, r = set_size(process_set), set_rank(process_set)
    rows = arr.shape[0] // n + (1 if r < arr.shape[0] % n else 0)
    out = aligned_empty((rows,) + arr.shape[1:], arr.dtype)
    sub = _reduction(OpType.REDUCESCATTER, name, arr, out, op, prescale, postscale, group, group_size, process_set)
    return sub, _converted_output, (conv, out)


# ---------------------------------------------------------------- finish(outcomes, keep_alive)

def common_output(outcomes, keep):
    """The common allreduce's: its output array."""
    return keep[1]


def _converted_output(outcomes, keep):
    """The output array in the caller's type."""
    conv, out = keep
    return conv.wrap(out)


def _written_back(outcomes, keep):
    """In place: the caller's object, with the output copied into it unless it was written there."""
    conv, out = keep
    if out is not conv.view:
        conv.view[...] = out
    return conv.original


def _gathered(outcomes, keep):
    """The engine's output buffer as the caller's type."""
    conv, arr = keep
    buffer, shape = outcomes[0][2:4]
    return conv.wrap(from_engine_buffer(buffer, shape, arr.dtype))


def _exchanged(outcomes, conv):
    """Always both, as Horovod's handles: alltoall() drops the splits when none were given."""
    buffer, shape, received = outcomes[0][2:5]
    output = conv.wrap(from_engine_buffer(buffer, shape, conv.array.dtype))
    return output, conv.wrap_index(np.asarray(received, dtype=np.int32))
