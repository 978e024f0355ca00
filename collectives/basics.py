"""Process-wide state: init, shutdown, topology, timeline."""
import atexit
import os
import threading

from . import config, framework_threads
from ._loader import engine_module
from .errors import NotInitializedError, raise_for_status

_lock = threading.Lock()
_engine = None  # the running collectives._engine.Engine
_atexit_registered = False
_owner_pid = None  # a forked child inherits the engine object but not its thread


def init(comm=None, process_sets=None):
    """Start the engine on a duplicate of ``comm`` (an mpi4py communicator; COMM_WORLD if None).

    ``process_sets``: ProcessSets (or rank lists) to register at once, on every rank, as
    Horovod's ``init(process_sets=[...])``; "dynamic" (Horovod's switch for adding sets
    later) is accepted: sets can always be added and removed after init here.
    Calling it again while initialized does nothing, as in Horovod.
    """
    _start_engine(comm)
    if process_sets and process_sets != "dynamic":
        from .process_sets import add_process_set

        for ps in process_sets:
            add_process_set(ps)


def _start_engine(comm):
    global _engine, _atexit_registered, _owner_pid
    with _lock:
        if _engine is not None and _engine.running:
            return
        values = config.load()
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
        code, message = engine.start(address, engine_config)
        raise_for_status(code, message)
        _engine = engine
        framework_threads.apply(values["framework_threads"], engine.local_size)
        _owner_pid = os.getpid()
        if not _atexit_registered:
            # Registered after mpi4py's import, so it runs before MPI is finalized.
            atexit.register(shutdown)
            _atexit_registered = True


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
    global _engine
    with _lock:
        engine, _engine = _engine, None
    if engine is not None and os.getpid() == _owner_pid:
        engine.shutdown()
    if engine is not None:
        from .process_sets import forget_all

        forget_all()


def is_initialized():
    return _engine is not None and _engine.running


def engine():
    """The running engine, or NotInitializedError."""
    e = _engine
    if e is None:
        raise NotInitializedError("collectives has not been initialized; use collectives.init().")
    return e


def rank():
    return engine().rank


def size():
    return engine().size


def local_rank():
    return engine().local_rank


def local_size():
    return engine().local_size


def cross_rank():
    return engine().cross_rank


def cross_size():
    return engine().cross_size


def mpi_threads_supported():
    """True when MPI runs with MPI_THREAD_MULTIPLE."""
    from mpi4py import MPI

    return engine().mpi_thread_level >= MPI.THREAD_MULTIPLE


def mpi_built():
    return True


def mpi_enabled():
    return True


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
    code, message = engine().start_timeline(str(file_path), bool(mark_cycles))
    raise_for_status(code, message)


def stop_timeline():
    engine().stop_timeline()
