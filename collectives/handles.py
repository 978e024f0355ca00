"""A request's last step: handles of asynchronous operations, ``poll`` and ``synchronize``
(collectives/submissions.py creates them)."""
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
        self._finish = finish          # finish(list of outcomes, keep_alive) -> user result
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
        keep_alive, self._keep_alive = self._keep_alive, None
        try:
            for code, message, *_ in outcomes:
                raise_for_status(code, message)
        except Exception as error:  # a failed operation fails again on every later wait
            self._error = error
            raise
        self._result = self._finish(outcomes, keep_alive)
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


def keep_until_waited(handle):
    """Hold ``handle`` (and so the arrays it keeps alive) until a wait collects it, even if the
    caller drops it."""
    _outstanding[id(handle)] = handle
    return handle
