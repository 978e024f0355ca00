"""What the verbs accept: names (given or generated), root ranks, reduction ops, scale factors
and alltoall splits. Each check raises a typed error naming the argument, instead of letting a
bad value reach the engine's binding (where it becomes an untyped cast error) or be coerced
silently (``op=3.7`` is not Min, ``root_rank=True`` is not rank 1)."""
import itertools
import math
import numbers
import threading

import numpy as np

from .constants import ReduceOp
from .errors import ArgumentTypeError, InvalidArgumentError

_INT32 = (-(2 ** 31), 2 ** 31 - 1)
_INT64 = (-(2 ** 63), 2 ** 63 - 1)

_name_lock = threading.Lock()
_counters = {}


def auto_name(kind, process_set_id=0):
    """``<kind>.noname.<n>``: the same on every rank as long as the ranks make their unnamed
    calls in the same order (Horovod's contract). One counter per process set, so that calls
    in a set the other ranks are not in do not shift theirs."""
    with _name_lock:
        counter = _counters.setdefault((kind, process_set_id), itertools.count())
        return f"{kind}.noname.{next(counter)}"


def name(value, kind, process_set_id=0):
    """The request name: ``value`` if given (a str the engine can carry), else a generated one."""
    if value is None or (isinstance(value, str) and value == ""):
        return auto_name(kind, process_set_id)
    if not isinstance(value, str):
        raise ArgumentTypeError(f"name must be a str, not {type(value).__name__} ({value!r})")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise InvalidArgumentError(f"name {value!r} is not valid text (it contains a lone surrogate)") from None
    return value


def member_names(group, count):
    """The request names of a grouped op's ``count`` members, as Horovod names them (its timeline
    shows them): ``<group>_1of<count>``, ``<group>_2of<count>``, ..."""
    return [f"{group}_{i + 1}of{count}" for i in range(count)]


def _integer(value, what, bounds):
    # bool is an int to Python, but root_rank=True is a mistake, not rank 1.
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (numbers.Integral, np.integer)):
        raise ArgumentTypeError(f"{what} must be an int, not {type(value).__name__} ({value!r})")
    value = int(value)
    if not bounds[0] <= value <= bounds[1]:
        raise InvalidArgumentError(f"{what} {value} is out of range")
    return value


def root_rank(value):
    return _integer(value, "root_rank", _INT32)


def reduce_op(op):
    """A ReduceOp from ``op`` (None: Average); a float or bool is refused, not truncated."""
    if op is None:
        return ReduceOp.AVERAGE
    if isinstance(op, (bool, np.bool_)) or not isinstance(op, (numbers.Integral, np.integer)):
        raise ArgumentTypeError(f"op must be a reduction op such as collectives.Sum, not {type(op).__name__} ({op!r})")
    try:
        return ReduceOp(int(op))
    except ValueError:
        raise InvalidArgumentError(f"unknown reduction op {op!r}") from None


def scale_factor(value, what):
    """A finite float: NaN never equals NaN (ranks would disagree with themselves) and an
    infinite factor has no meaning for integer tensors."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (numbers.Real, np.floating, np.integer)):
        raise ArgumentTypeError(f"{what} must be a number, not {type(value).__name__} ({value!r})")
    value = float(value)
    if not math.isfinite(value):
        raise InvalidArgumentError(f"{what} must be finite, got {value}")
    return value


def splits(value):
    """alltoall splits as a list of ints (None: equal parts), each within int64 and their sum
    too (the engine adds them in int64). Splits of a non-integer type are refused whatever
    their values (as Horovod does): 2.0 rows is no count, and a float array of garbage must not
    become a huge count."""
    if value is None:
        return []
    array = np.asarray(value)
    # kind "O": Python ints beyond int64 (and mixed lists), which _integer judges one by one.
    if array.size and array.dtype.kind not in "iuO":
        raise ArgumentTypeError(f"alltoall splits must be integers, not {array.dtype} values")
    # tolist() gives Python ints (any size), floats or bools, which _integer tells apart.
    result = [_integer(s, "alltoall split", _INT64) for s in array.reshape(-1).tolist()]
    if any(s < 0 for s in result):
        raise InvalidArgumentError(f"alltoall splits must not be negative: {result}")
    if sum(result) > _INT64[1]:
        raise InvalidArgumentError(f"alltoall splits sum to {sum(result)}, more than a tensor can have")
    return result
