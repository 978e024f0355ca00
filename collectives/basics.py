"""Process-wide state: init, shutdown, topology, timeline.

Lifecycle rules (docs/api.md, "Stopping, starting again, exit, signals, fork"):
  * ``shutdown()`` stops the engine on every rank; ``init()`` may start it again when every
    rank stopped through ``shutdown()`` calls.
  * A stall shutdown, an MPI failure, a rank's exit or an ``init()`` timeout is final for the
    process: later ``init()`` calls and operations raise ShutdownError at once with the reason.
  * ``init()`` waits at most COLLECTIVES_INIT_TIMEOUT_SECONDS for every rank (StallTimeoutError).
  * A forked child (DataLoader workers) keeps the parent's topology (``rank()``, ...) but cannot
    run operations: they raise NotInitializedError. It never touches the parent's engine object.
"""
import atexit
import os
import sys
import threading

from . import config, framework_threads
from ._loader import engine_module
from .errors import NotInitializedError, ShutdownError, StallTimeoutError, raise_for_status

_TIMEOUT = 7  # csrc/common/status.h StatusCode::TIMEOUT

# What every face (collectives, .torch, .tensorflow, .keras) exports from here, with a star
# import, as Horovod's faces all carry its basics: one list instead of four.
__all__ = [
    "cross_rank",
    "cross_size",
    "cuda_built",
    "gloo_built",
    "gloo_enabled",
    "init",
    "is_homogeneous",
    "is_initialized",
    "local_rank",
    "local_size",
    "mpi_built",
    "mpi_enabled",
    "mpi_threads_supported",
    "nccl_built",
    "rank",
    "rocm_built",
    "shutdown",
    "size",
    "start_timeline",
    "stop_timeline",
]

_lock = threading.Lock()
_engine = None  # the running collectives._engine.Engine
_atexit_registered = False
_owner_pid = None  # the process that started collectives (MPI is its, not a forked child's)
_final_stop = None  # why collectives cannot start again in this process (None: it can)
# In a forked child: the parent's engine (kept, never destroyed: its threads and locks are the
# parent's) for rank() and friends, and the parent's pid for the error message.
_parent_engine = None
_parent_pid = None
_ever_started = False  # an engine has started in this process (or its forking parent): mpi_enabled()


# What the layers above want done each time the engine starts or stops (process sets register
# theirs). Hooks, not imports: this module is the bottom layer and imports nothing above it.
_started_hooks = []  # fn(process_sets): right after init() started the engine, in registration order
_stopped_hooks = []  # fn(): after shutdown() stopped it


def when_started(hook):
    """Run ``hook(process_sets)`` on every rank after each ``init()`` that starts the engine,
    with the ``process_sets`` argument given to ``init()``."""
    _started_hooks.append(hook)


def when_stopped(hook):
    """Run ``hook()`` after each ``shutdown()`` that stops the engine."""
    _stopped_hooks.append(hook)


def _after_fork_in_child():
    global _lock, _engine, _parent_engine, _parent_pid
    _lock = threading.Lock()  # another thread of the parent may have held it at the fork
    if _owner_pid is not None and _parent_pid is None:
        _parent_engine, _engine = _engine, None
        _parent_pid = _owner_pid


os.register_at_fork(after_in_child=_after_fork_in_child)


def init(comm=None, process_sets=None):
    """Start the engine on a duplicate of ``comm`` (an mpi4py communicator; COMM_WORLD if None).

    ``process_sets``: ProcessSets (or rank lists) to register at once, on every rank, as
    Horovod's ``init(process_sets=[...])``; "dynamic" (Horovod's switch for adding sets
    later) is accepted: sets can always be added and removed after init here.
    Calling it again while initialized does nothing, as in Horovod. Raises StallTimeoutError when
    not every rank reaches ``init()`` within COLLECTIVES_INIT_TIMEOUT_SECONDS, and ShutdownError
    once collectives stopped for good in this process (see the module's docstring).
    """
    if _start_engine(comm):
        for hook in _started_hooks:
            hook(process_sets)


def _final_error():
    return ShutdownError(f"collectives stopped earlier in this process: {_final_stop.rstrip('.')}; "
                         "it cannot be restarted in this process")


def _forked_error():
    return NotInitializedError(engine_module().forked_child_message(_parent_pid))


def _let_engine_initialize_mpi():
    """MPI_Init_thread returns only once every rank has called it, and mpi4py's import runs it
    holding the GIL: a rank that never starts would block this one for good, beyond the init
    timeout's reach. So unless mpi4py.MPI is imported already, import it without initializing
    MPI: the engine thread does, under the timeout. The engine then also finalizes MPI at exit,
    in this process only: a forked child that exits normally must not (mpi4py's finalization
    would run the parent's shutdown protocol with the launcher and break the job)."""
    if "mpi4py.MPI" in sys.modules:
        return
    import mpi4py

    mpi4py.rc.initialize = False
    mpi4py.rc.finalize = False


def _start_engine(comm):
    global _engine, _atexit_registered, _owner_pid, _final_stop, _ever_started
    with _lock:
        if _parent_pid is not None:
            raise _forked_error()
        if _final_stop is not None:
            raise _final_error()
        if _engine is not None:
            if _engine.running:
                return
            raise stopped_error(_engine, None)
        values = config.load()
        config.export_engine_environment(values)
        _let_engine_initialize_mpi()
        mod = engine_module()
        mod.set_log_level(config.LOG_LEVELS.index(values["log_level"]))
        address = 0
        if comm is not None:
            from mpi4py import MPI

            if not isinstance(comm, MPI.Comm):
                raise TypeError(f"init(comm=...) takes an mpi4py communicator, not {type(comm).__name__}")
            address = MPI._addressof(comm)
        engine = mod.Engine()
        engine_config = config.engine_config(values)
        engine_config.update(_gpu_libraries())
        if not _atexit_registered:
            # Registered after mpi4py's import, so it runs before MPI is finalized.
            atexit.register(_shutdown_at_exit)
            _atexit_registered = True
        _owner_pid = os.getpid()
        code, message = engine.start(address, engine_config)
        if code == _TIMEOUT:
            # The engine thread is stuck inside MPI for good (the engine object is kept for it).
            _final_stop = message
            raise StallTimeoutError(message)
        raise_for_status(code, message)
        _engine = engine
        _ever_started = True
        framework_threads.apply(values["framework_threads"], engine.local_size)
        return True  # started now


def stopped_error(engine, fallback):
    """The ShutdownError for using an engine whose thread has stopped (``fallback``: the message
    while its stop is still being recorded). Records a final stop."""
    global _final_stop
    stopped, restartable, _, message = engine.stop_info()
    if not stopped:
        return ShutdownError(fallback or "collectives has stopped")
    if not restartable:
        if _final_stop is None:
            _final_stop = message
        return _final_error()
    return ShutdownError(f"{message}; call collectives.shutdown() on this rank too, then init() on every rank "
                         "to start again")


def _gpu_libraries():
    """Where the engine loads the CUDA driver and NCCL from (collectives/gpu_libs.py's search:
    $COLLECTIVES_NCCL_LIBRARY, the nvidia-nccl wheel, the system). Finding nothing is no error:
    GPU tensors then fail with the reason."""
    from . import gpu_libs

    search = gpu_libs.search_nccl()
    return {
        "cuda_driver_library": gpu_libs.CUDA_DRIVER_SONAME,
        "nccl_library": search.found.path if search.found else "",
        "nccl_problem": "" if search.found else search.describe_failure(),
    }


def shutdown():
    """Stop the engine on every rank. Pending operations fail with ShutdownError."""
    _shutdown(exiting=False)


def _shutdown_at_exit():
    # The other ranks learn that this one is gone for good: their init() raises at once instead
    # of waiting for it.
    _shutdown(exiting=True)


def _shutdown(exiting):
    global _engine, _final_stop
    with _lock:
        engine, _engine = _engine, None
    if engine is None:
        return
    engine.shutdown(exiting)
    stopped, restartable, _, message = engine.stop_info()
    if stopped and not restartable and _final_stop is None:
        _final_stop = message
    for hook in _stopped_hooks:
        hook()


def is_initialized():
    """True while the engine runs (in a forked child: while the parent's did at the fork)."""
    e = _engine if _engine is not None else _parent_engine
    return e is not None and e.running


def _not_running_error():
    if _parent_pid is not None:
        return _forked_error()
    if _final_stop is not None:
        return _final_error()
    return NotInitializedError("collectives has not been initialized; use collectives.init().")


def engine():
    """The running engine, or NotInitializedError (ShutdownError once stopped for good)."""
    e = _engine
    if e is None:
        raise _not_running_error()
    return e


def _described():
    """The engine that describes this process's place in the job: the running one, or in a
    forked child the parent's (its topology stays true; its operations are not the child's)."""
    e = _engine if _engine is not None else _parent_engine
    if e is None:
        raise _not_running_error()
    return e


def rank():
    return _described().rank


def size():
    return _described().size


def local_rank():
    return _described().local_rank


def local_size():
    return _described().local_size


def cross_rank():
    return _described().cross_rank


def cross_size():
    return _described().cross_size


def is_homogeneous():
    """True when every host runs the same number of ranks (Horovod's definition: every rank's
    local_size is equal)."""
    return _described().homogeneous  # NotInitializedError before init(), as rank() and friends


def mpi_threads_supported():
    """True when MPI runs with MPI_THREAD_MULTIPLE."""
    from mpi4py import MPI

    return _described().mpi_thread_level >= MPI.THREAD_MULTIPLE


def mpi_built():
    return True


def mpi_enabled():
    """True once ``init()`` has started MPI in this process (and after ``shutdown()``), as
    Horovod's, whose MPI controller is enabled by its first ``init()``; False before it."""
    return _ever_started


def gloo_built():
    return False


def gloo_enabled():
    return False


def nccl_built():
    """Version code of the NCCL the engine loaded (22105 for 2.21.5), 0 when none. Before
    ``init()``: the version of the NCCL that ``init()`` would load."""
    if is_initialized():
        return int(engine_module().gpu_info()["nccl_version"])
    from . import gpu_libs

    found = gpu_libs.find_nccl()
    return found.version if found else 0


def cuda_built():
    """Whether the CUDA driver was found (by the engine at ``init()``; before it, whether
    libcuda.so.1 loads). A GPU device is not required."""
    if is_initialized():
        return bool(engine_module().gpu_info()["cuda_found"])
    import ctypes

    from . import gpu_libs

    try:
        return hasattr(ctypes.CDLL(gpu_libs.CUDA_DRIVER_SONAME), "cuDriverGetVersion")
    except OSError:
        return False


def rocm_built():
    return False


def start_timeline(file_path, mark_cycles=False):
    """Start writing a Chrome-trace timeline (rank 0 writes; other ranks ignore the call)."""
    if not isinstance(file_path, (str, os.PathLike)):
        from .errors import ArgumentTypeError

        raise ArgumentTypeError(f"start_timeline's file_path must be a str or path, not {type(file_path).__name__}")
    code, message = engine().start_timeline(os.fspath(file_path), bool(mark_cycles))
    raise_for_status(code, message)


def stop_timeline():
    engine().stop_timeline()
