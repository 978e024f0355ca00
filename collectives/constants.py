"""Reduction operations and the engine's enumerations (numbering as in csrc/common/types.h)."""
import enum
import warnings


class ReduceOp(enum.IntEnum):
    # Horovod's values, so code comparing hvd.Average == 0 still works.
    AVERAGE = 0
    SUM = 1
    ADASUM = 2
    MIN = 3
    MAX = 4
    PRODUCT = 5


Average = ReduceOp.AVERAGE
Sum = ReduceOp.SUM
Adasum = ReduceOp.ADASUM
Min = ReduceOp.MIN
Max = ReduceOp.MAX
Product = ReduceOp.PRODUCT


def resolve_op(op, average, stacklevel=2):
    """Horovod's rule for the faces' ``op``/``average`` pair: ``op`` wins; the deprecated
    ``average`` bool maps to Average/Sum; the default is Average. ``stacklevel`` points the
    deprecation warning at the user's call."""
    if op is not None:
        if average is not None:
            raise ValueError("The op parameter supersedes average. Please provide only one of them.")
        return op
    if average is not None:
        warnings.warn("Parameter `average` has been replaced with `op` and will be removed in v1.0",
                      DeprecationWarning, stacklevel=stacklevel)
        return Average if average else Sum
    return Average


class OpType(enum.IntEnum):
    ALLREDUCE = 0
    BROADCAST = 1
    ALLGATHER = 2
    ALLTOALL = 3
    REDUCESCATTER = 4
    BARRIER = 5
    JOIN = 6
    PROCESS_SET_ADD = 7
    PROCESS_SET_REMOVE = 8


class DataType(enum.IntEnum):
    UINT8 = 0
    INT8 = 1
    INT16 = 2
    INT32 = 3
    INT64 = 4
    FLOAT16 = 5
    BFLOAT16 = 6
    FLOAT32 = 7
    FLOAT64 = 8
    BOOL = 9
