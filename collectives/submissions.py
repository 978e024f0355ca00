"""A request's third step: the engine's Submission (named fields, csrc/python/bindings.cc) and its
enqueueing. ``submit`` gives a Handle (collectives/handles.py, the last step); the synchronous
verbs' ``run_now`` and ``allreduce_now`` wait here and give the result without one.

The steps before: collectives/arguments.py checks the verbs' arguments, collectives/requests.py
(host arrays) and collectives/device_ops.py (GPU arrays) turn a tensor into the engine's view of
it and build its Submission."""
from . import basics
from ._loader import engine_module
from .errors import raise_for_status
from .handles import Handle, _outstanding, keep_until_waited



def __getattr__(attribute):
    """``submission``: the engine's ``submission(op, name, input=None, output=None, dtype=0,
    reduce_op=SUM, root=0, prescale=1.0, postscale=1.0, splits=(), group="", group_size=0,
    process_set=0)``, which builds an engine.Submission (csrc/python/bindings.cc) from values the earlier
    steps checked; ``input``/``output``: C-contiguous numpy arrays, engine.DeviceTensor for GPU
    memory, or None. Looked up here on first use, so that importing collectives does not load
    the engine (and MPI); callers write ``submissions.submission(...)``, a module attribute from
    then on."""
    if attribute != "submission":
        raise AttributeError(f"module {__name__!r} has no attribute {attribute!r}")
    global submission
    submission = engine_module().submission
    return submission


def _enqueue(submissions, caller_waits=False):
    engine = basics.engine()
    code, message, ids = engine.enqueue(submissions, caller_waits)
    if code:
        if not engine.running:
            raise basics.stopped_error(engine, message)
        raise_for_status(code, message)
    return engine, ids


def submit(submissions, finish, keep_alive):
    """Enqueue engine submissions atomically; returns a Handle whose wait gives
    ``finish(outcomes, keep_alive)``. ``keep_alive``: the objects whose memory the engine uses
    (and from which ``finish`` makes the result)."""
    engine, ids = _enqueue(submissions)
    handle = Handle(engine, ids, finish, keep_alive)
    _outstanding[id(handle)] = handle  # keep_until_waited, inline: this is every async verb's path
    return handle


def run_now(submissions, finish, keep_alive):
    """``synchronize(submit(...))`` without the Handle object, for the synchronous verbs. When
    the wait is interrupted (a signal handler raised), the operation still runs in the engine:
    a Handle then keeps its arrays alive, as ``submit`` would have. The engine thread is not
    woken: this thread's wait runs the cycle itself when it can (csrc/core/engine_inline.cc)."""
    engine, ids = _enqueue(submissions, True)
    wait = engine.wait
    outcomes = []
    try:
        for i in ids:
            outcomes.append(wait(i))
    except BaseException:
        handle = Handle(engine, ids, finish, keep_alive)
        handle._outcomes = outcomes  # a later wait would resume after these
        keep_until_waited(handle)
        raise
    for code, message, *_ in outcomes:
        raise_for_status(code, message)
    return finish(outcomes, keep_alive)


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
        keep_until_waited(Handle(engine, [first], lambda _, keep: keep[1], (tensor, second)))
        raise error
    if what == _REFUSED and not engine.running:
        raise basics.stopped_error(engine, second)
    raise_for_status(first, second)
    raise AssertionError(f"engine.allreduce_now returned {result!r}")  # a failure always has a nonzero code
