"""The exception hierarchy: what the engine's status codes become at the Python boundary."""


class CollectivesError(RuntimeError):
    """Base class of every error raised by collectives."""

    # Autograph re-raises an error from a traced tf.function with its own type only when the
    # type's constructor is Exception's; otherwise the user sees a generic StagingError.
    __init__ = Exception.__init__


class NotInitializedError(CollectivesError, ValueError):
    """An operation was called before ``init()`` (a ValueError, as in Horovod), or in a forked
    child of an initialized process (a DataLoader worker), which cannot use the parent's engine."""


class InvalidArgumentError(CollectivesError, ValueError):
    """Bad arguments detected on this rank (shape, splits, root rank, ...)."""


class ArgumentTypeError(InvalidArgumentError, TypeError):
    """An argument of the wrong type (``root_rank=1.7``, ``name=123``, ``op=True``): both a
    ValueError, like every bad argument here, and the TypeError Python code expects."""


class DuplicateNameError(InvalidArgumentError):
    """A collective with the same name is still in flight."""


class UnsupportedTypeError(CollectivesError, ValueError, TypeError):
    """The data type cannot be used for this operation. A ValueError, the type Horovod raises
    for an unsupported dtype, and a TypeError, which the TensorFlow face's callers expect."""


class UnregisteredProcessSetError(InvalidArgumentError, TypeError):
    """A collective got a ProcessSet that is not registered (never added, or removed). Horovod
    passes the set's ``process_set_id`` of None to its extension, which raises TypeError; this
    keeps that type and our clear message (and stays an InvalidArgumentError)."""


class NotSupportedError(CollectivesError, NotImplementedError):
    """A valid request this library (like Horovod) does not support in this configuration:
    Adasum on a non-power-of-two number of ranks, in a process set, or on GPU memory. A
    NotImplementedError, the type Horovod raises for these."""


class TensorMismatchError(CollectivesError):
    """Ranks submitted the same name with different shapes, dtypes, ops, reduce ops or roots.

    Raised on every rank, naming the tensor and the ranks that disagree.
    """


class ShutdownError(CollectivesError):
    """The engine stopped (``shutdown()`` here or on another rank) while the operation was pending;
    or any operation and ``init()`` after collectives stopped for good in this process."""


class StallTimeoutError(CollectivesError, TimeoutError):
    """The engine shut down because a tensor stalled past COLLECTIVES_STALL_SHUTDOWN_TIME_SECONDS;
    or ``init()`` did not see every rank within COLLECTIVES_INIT_TIMEOUT_SECONDS."""


class InternalError(CollectivesError):
    """A failure inside the engine or the MPI library."""


# Status codes of csrc/common/status.h, in order.
_BY_CODE = {
    1: InvalidArgumentError,
    2: UnsupportedTypeError,
    3: DuplicateNameError,
    4: NotInitializedError,
    5: TensorMismatchError,
    6: ShutdownError,
    7: StallTimeoutError,
    8: InternalError,
    9: NotSupportedError,
}


def raise_for_status(code, message):
    """Raise the exception for an engine status; return for OK (code 0)."""
    if code == 0:
        return
    raise _BY_CODE.get(code, InternalError)(message)
