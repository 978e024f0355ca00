"""Handles of asynchronous operations: ``poll`` and ``synchronize``."""
from . import basics
from .errors import ArgumentTypeError, InvalidArgumentError, raise_for_status

# Handles not yet synchronized. Holding them here keeps the arrays the engine reads and
# writes alive even if the caller drops its handle (the engine never touches Python objects).
_outstanding = {}


class Handle:
    """One asynchronous operation (one or several engine requests, for grouped ops).

    Holds the Python objects whose memory the engine reads or writes until the operation is
    synchronized, so they cannot be freed under it.
    """

    __slots__ = ("_engine", "_ids", "_finish", "_keep_alive", "_result", "_error", "_done", "_outcomes", "_released")

    def __init__(self, engine, ids, finish, keep_alive):
        self._engine = engine
        self._ids = list(ids)
        self._finish = finish          # callable(list of outcomes) -> user result
        self._keep_alive = keep_alive
        self._result = None
        self._error = None
        self._done = False
        self._outcomes = []  # of the ids collected so far
        self._released = False  # a public synchronize() of Horovod's faces consumed it (see release_after_wait)

    def poll(self):
        return self._done or all(self._engine.poll(i) for i in self._ids)

    def _finished(self):
        """True once a wait has collected the operation's outcome (a result or its error); an
        interrupted wait leaves it False."""
        return self._done

    def wait(self):
        if self._done:
            if self._error is not None:
                raise self._error
            return self._result
        # Each wait releases the GIL while blocked, then removes the engine's record. Python's
        # signal handlers run meanwhile; one that raises (Ctrl-C) leaves the engine's record of
        # that id in place and the outcomes so far here, so a later wait resumes where it stopped.
        outcomes = self._outcomes
        wait = self._engine.wait
        for i in self._ids[len(outcomes):]:
            outcomes.append(wait(i))
        self._outcomes = None
        _outstanding.pop(id(self), None)
        self._done = True
        self._keep_alive = None
        try:
            for code, message, *_ in outcomes:
                raise_for_status(code, message)
        except Exception as error:  # a failed operation fails again on every later wait
            self._error = error
            raise
        self._result = self._finish(outcomes)
        return self._result

    def __repr__(self):
        return f"<collectives.Handle ids={self._ids} done={self._done}>"


def _check(handle):
    if not isinstance(handle, Handle):
        raise ArgumentTypeError(f"expected a handle returned by an *_async call, got {type(handle).__name__}")
    return handle


def released_error(handle):
    """What ``poll`` raises for a handle a public ``synchronize`` already released (Horovod's
    ValueError and message)."""
    return InvalidArgumentError(f"Handle {handle!r} was not created or has been cleared.")


def release_after_wait(handle):
    """Horovod's public ``synchronize(handle)``: wait and return the result, then release the
    handle, so a second ``synchronize`` returns None and ``poll`` raises ValueError. A failed
    operation is released too (its error is raised once, as in Horovod). A wait interrupted by
    a signal handler (Ctrl-C) does not release it: a later synchronize returns the result.
    The handle's own ``wait()``, which internal callers use, keeps returning the result."""
    if handle._released:
        return None
    try:
        result = handle.wait()
    except BaseException:
        if handle._finished():
            handle._released = True
        raise
    handle._released = True
    return result


def poll_unreleased(handle):
    """Horovod's public ``poll``: raises ValueError once ``synchronize`` released the handle."""
    if handle._released:
        raise released_error(handle)
    return handle.poll()


def poll(handle):
    """True when the asynchronous operation has finished (``synchronize`` will not block)."""
    return _check(handle).poll()


def synchronize(handle):
    """Wait for an asynchronous operation and return its result (raises its error)."""
    return _check(handle).wait()


def _enqueue(specs, caller_waits=False):
    engine = basics.engine()
    code, message, ids = engine.enqueue(specs, caller_waits)
    if code:
        if not engine.running:
            raise basics.stopped_error(engine, message)
        raise_for_status(code, message)
    return engine, ids


def submit(specs, finish, keep_alive):
    """Enqueue engine submissions atomically; returns a Handle."""
    engine, ids = _enqueue(specs)
    handle = Handle(engine, ids, finish, keep_alive)
    _outstanding[id(handle)] = handle
    return handle


_REFUSED, _FAILED, _INTERRUPTED = 0, 1, 2  # csrc/python/allreduce_now.cc


def allreduce_now(tensor, name, op, prescale, postscale, inplace):
    """The synchronous allreduce of a numpy array in one engine call (csrc/python/allreduce_now.cc):
    the output array, or None when the call is not the common case and nothing was submitted
    (the caller then takes the general path with the same name, which also raises when no
    engine runs). Failures raise as in ``run_now``."""
    engine = basics._engine
    if engine is None:
        return None
    result = engine.allreduce_now(tensor, name, op, prescale, postscale, inplace)
    if type(result) is not tuple:
        return result
    what, first, second, error = result
    if what == _INTERRUPTED:  # as run_now: the request runs on, a Handle keeps its arrays alive
        handle = Handle(engine, [first], lambda _: second, (tensor, second))
        _outstanding[id(handle)] = handle
        raise error
    if what == _REFUSED and not engine.running:
        raise basics.stopped_error(engine, second)
    raise_for_status(first, second)
    raise AssertionError(f"engine.allreduce_now returned {result!r}")  # a failure always has a nonzero code


def run_now(specs, finish, keep_alive):
    """``synchronize(submit(...))`` without the Handle object, for the synchronous verbs. When
    the wait is interrupted (a signal handler raised), the operation still runs in the engine:
    a Handle then keeps its arrays alive, as ``submit`` would have. The engine thread is not
    woken: this thread's wait runs the cycle itself when it can (csrc/core/engine_inline.cc)."""
    engine, ids = _enqueue(specs, True)
    wait = engine.wait
    outcomes = []
    try:
        for i in ids:
            outcomes.append(wait(i))
    except BaseException:
        handle = Handle(engine, ids, finish, keep_alive)
        handle._outcomes = outcomes  # a later wait would resume after these
        _outstanding[id(handle)] = handle
        raise
    for code, message, *_ in outcomes:
        raise_for_status(code, message)
    return finish(outcomes)
