"""Locates and probes the GPU libraries (NCCL, the CUDA driver and runtime) without importing
any framework, and never raises because one is absent.

The engine loads NCCL at run time (one build serves machines with and without CUDA), from the
path ``find_nccl()`` returns. Search order for NCCL:

1. ``$COLLECTIVES_NCCL_LIBRARY``: a path (or soname) chosen by the user. When set it is the only
   candidate: a wrong value is reported, not silently replaced by another NCCL.
2. The ``libnccl.so.2`` of an ``nvidia-nccl-cu*`` wheel (the one PyTorch's CUDA builds install):
   ``nvidia/nccl/lib/`` under each ``sys.path`` entry.
3. The system's: the name ``ctypes.util.find_library`` reports, then a plain ``dlopen`` of
   ``libnccl.so.2`` (LD_LIBRARY_PATH, ld.so.cache).

Probing loads the library with ctypes and asks it for its version; ``ncclGetVersion`` and
``cudaRuntimeGetVersion`` need no GPU. ``probe_cuda()`` also calls the driver's ``cuInit`` to
count devices: do not call it in a process that forks workers afterwards (CUDA does not survive
fork); ``find_nccl()`` does not touch the driver.

Only the standard library is used, so ``python collectives/gpu_libs.py`` works anywhere.
"""
import ctypes
import ctypes.util
import glob
import os
import sys
from dataclasses import dataclass
from typing import List, Optional, Sequence, Tuple
from . import config

NCCL_ENV = config.KNOBS["nccl_library"].env  # the registry's (collectives/config.py)
NCCL_SONAME = "libnccl.so.2"
CUDA_DRIVER_SONAME = "libcuda.so.1"

# Where NVIDIA's pip wheels put their libraries, relative to a sys.path entry.
NCCL_WHEEL_PATTERNS = ("nvidia/nccl/lib/libnccl.so.2", "nvidia/*/lib/libnccl.so.2")
CUDART_WHEEL_PATTERNS = ("nvidia/cuda_runtime/lib/libcudart.so.*", "nvidia/*/lib/libcudart.so.*")


@dataclass(frozen=True)
class LibInfo:
    path: str  # the file the dynamic loader actually opened (absolute when it can be known)
    version: int  # the library's version code (NCCL: 22105 for 2.21.5; CUDA: 12040 for 12.4)
    source: str  # "env", "wheel" or "system": which rule of the search found it
    version_string: str  # the version for people: "2.21.5", "12.4"


@dataclass(frozen=True)
class Attempt:
    """A candidate that was tried and not used, with the reason."""
    candidate: str
    source: str
    problem: str


@dataclass(frozen=True)
class NcclSearch:
    found: Optional[LibInfo]
    attempts: Tuple[Attempt, ...]  # everything tried before (or instead of) ``found``

    def describe_failure(self):
        if not self.attempts:
            return "not found"
        return "not found (" + "; ".join(f"{a.candidate}: {a.problem}" for a in self.attempts) + ")"


@dataclass(frozen=True)
class CudaInfo:
    driver: Optional[LibInfo]  # libcuda.so.1; version from cuDriverGetVersion
    runtime: Optional[LibInfo]  # libcudart; version from cudaRuntimeGetVersion
    device_count: int  # devices the driver reports; 0 when there is no usable driver or device
    problem: str  # why no device is usable; "" when device_count > 0

    @property
    def available(self):
        return self.device_count > 0


def nccl_version_string(code):
    """22105 -> '2.21.5' (ncclGetVersion's encoding)."""
    # NCCL_VERSION_CODE is major*10000 + minor*100 + patch since 2.9, major*1000 + minor*100 + patch before.
    if code >= 10000:
        return f"{code // 10000}.{code // 100 % 100}.{code % 100}"
    return f"{code // 1000}.{code // 100 % 10}.{code % 100}"


def cuda_version_string(code):
    """12040 -> '12.4' (the encoding of cudaRuntimeGetVersion and cuDriverGetVersion)."""
    return f"{code // 1000}.{code % 1000 // 10}"


class _DlInfo(ctypes.Structure):
    _fields_ = [("dli_fname", ctypes.c_char_p), ("dli_fbase", ctypes.c_void_p),
                ("dli_sname", ctypes.c_char_p), ("dli_saddr", ctypes.c_void_p)]


def _loaded_path(function, fallback):
    """The file a loaded symbol lives in (dladdr), so a library opened by soname is reported
    by the path the engine can later open; ``fallback`` if that cannot be found out."""
    for lib in (None, "libdl.so.2"):
        try:
            dladdr = ctypes.CDLL(lib).dladdr
        except (OSError, AttributeError):
            continue
        dladdr.argtypes = [ctypes.c_void_p, ctypes.POINTER(_DlInfo)]
        info = _DlInfo()
        if dladdr(ctypes.cast(function, ctypes.c_void_p), ctypes.byref(info)) and info.dli_fname:
            return os.path.abspath(os.fsdecode(info.dli_fname))
    return fallback


def _load(candidate):
    """(library, None) or (None, reason)."""
    try:
        return ctypes.CDLL(candidate), None
    except OSError as e:
        reason = str(e) or "cannot be loaded"
        # dlerror() repeats the name ("libx.so: libx.so: cannot open ..."); the caller names it already.
        return None, reason[len(candidate) + 2:] if reason.startswith(candidate + ": ") else reason


def _version_of(lib, symbol):
    """(version code, function) from an ``int f(int*)`` version query, or (None, reason)."""
    try:
        function = getattr(lib, symbol)
    except AttributeError:
        return None, f"has no {symbol} (not the expected library)"
    function.restype = ctypes.c_int
    function.argtypes = [ctypes.POINTER(ctypes.c_int)]
    version = ctypes.c_int(0)
    status = function(ctypes.byref(version))
    if status != 0:
        return None, f"{symbol} returned error {status}"
    return (version.value, function), None


def _wheel_files(patterns, search_paths):
    seen = []
    for entry in search_paths:
        if not entry or not os.path.isdir(entry):
            continue
        for pattern in patterns:
            for path in sorted(glob.glob(os.path.join(entry, pattern))):
                if path not in seen:
                    seen.append(path)
    return seen


def nccl_candidates(environ=None, search_paths: Optional[Sequence[str]] = None,
                    include_system=True) -> List[Tuple[str, str]]:
    """(source, path or soname) in the order they are tried; ``include_system=False`` leaves
    out the system's library (the dynamic loader's search, which no argument here controls)."""
    environ = os.environ if environ is None else environ
    explicit = config.read("nccl_library", environ)
    if explicit:
        return [("env", explicit)]
    paths = sys.path if search_paths is None else search_paths
    found = [("wheel", p) for p in _wheel_files(NCCL_WHEEL_PATTERNS, paths)]
    if not include_system:
        return found
    system = ctypes.util.find_library("nccl")
    if system:
        found.append(("system", system))
    if system != NCCL_SONAME:
        found.append(("system", NCCL_SONAME))
    return found


def search_nccl(environ=None, search_paths: Optional[Sequence[str]] = None, include_system=True) -> NcclSearch:
    """The first NCCL that loads and answers ncclGetVersion, and what was tried before it."""
    attempts = []
    for source, candidate in nccl_candidates(environ, search_paths, include_system):
        lib, problem = _load(candidate)
        if lib is not None:
            result, problem = _version_of(lib, "ncclGetVersion")
            if result is not None:
                version, function = result
                info = LibInfo(_loaded_path(function, candidate), version, source, nccl_version_string(version))
                return NcclSearch(info, tuple(attempts))
        label = f"${NCCL_ENV}={candidate}" if source == "env" else candidate
        attempts.append(Attempt(label, source, problem))
    return NcclSearch(None, tuple(attempts))


def find_nccl(environ=None, search_paths: Optional[Sequence[str]] = None, include_system=True) -> Optional[LibInfo]:
    """The NCCL the engine should load, or None."""
    return search_nccl(environ, search_paths, include_system).found


def find_cuda_runtime(search_paths: Optional[Sequence[str]] = None) -> Optional[LibInfo]:
    """libcudart from an nvidia-cuda-runtime wheel, else the system's; None if neither loads."""
    paths = sys.path if search_paths is None else search_paths
    candidates = [("wheel", p) for p in _wheel_files(CUDART_WHEEL_PATTERNS, paths)]
    system = ctypes.util.find_library("cudart")
    if system:
        candidates.append(("system", system))
    for source, candidate in candidates:
        lib, _ = _load(candidate)
        if lib is None:
            continue
        result, _ = _version_of(lib, "cudaRuntimeGetVersion")
        if result is not None:
            version, function = result
            return LibInfo(_loaded_path(function, candidate), version, source, cuda_version_string(version))
    return None


def _cuda_error(lib, code):
    try:
        name = ctypes.c_char_p()
        lib.cuGetErrorName.argtypes = [ctypes.c_int, ctypes.POINTER(ctypes.c_char_p)]
        if lib.cuGetErrorName(code, ctypes.byref(name)) == 0 and name.value:
            return f"{name.value.decode()} ({code})"
    except AttributeError:
        pass
    return f"error {code}"


_device_count = None


def cuda_device_count(driver=CUDA_DRIVER_SONAME):
    """Devices the CUDA driver reports (cuInit + cuDeviceGetCount, which retain no context);
    0 without a usable driver. Cached: the answer does not change within a process."""
    global _device_count
    if _device_count is None:
        lib, _ = _load(driver)
        count = ctypes.c_int(0)
        try:
            lib.cuInit.argtypes = [ctypes.c_uint]
            lib.cuDeviceGetCount.argtypes = [ctypes.POINTER(ctypes.c_int)]
            ok = lib.cuInit(0) == 0 and lib.cuDeviceGetCount(ctypes.byref(count)) == 0
        except AttributeError:  # no library (lib is None), or not a driver
            ok = False
        _device_count = count.value if ok else 0
    return _device_count


def probe_cuda(search_paths: Optional[Sequence[str]] = None, driver=CUDA_DRIVER_SONAME) -> CudaInfo:
    """The CUDA driver (cuInit + cuDeviceGetCount) and runtime. Calls cuInit: see the module note
    on fork."""
    runtime = find_cuda_runtime(search_paths)
    lib, problem = _load(driver)
    if lib is None:
        return CudaInfo(None, runtime, 0, f"the CUDA driver ({driver}) is not installed: {problem}")
    result, problem = _version_of(lib, "cuDriverGetVersion")
    if result is None:
        return CudaInfo(None, runtime, 0, f"{driver} {problem}")
    version, function = result
    info = LibInfo(_loaded_path(function, driver), version, "system", cuda_version_string(version))
    try:
        lib.cuInit.argtypes = [ctypes.c_uint]
        status = lib.cuInit(0)
        if status != 0:
            return CudaInfo(info, runtime, 0, f"cuInit failed: {_cuda_error(lib, status)}")
        count = ctypes.c_int(0)
        lib.cuDeviceGetCount.argtypes = [ctypes.POINTER(ctypes.c_int)]
        status = lib.cuDeviceGetCount(ctypes.byref(count))
    except AttributeError as e:
        return CudaInfo(info, runtime, 0, f"{driver} lacks a driver function: {e}")
    if status != 0:
        return CudaInfo(info, runtime, 0, f"cuDeviceGetCount failed: {_cuda_error(lib, status)}")
    return CudaInfo(info, runtime, count.value, "" if count.value > 0 else "the driver reports no CUDA devices")


def _main():
    nccl = search_nccl()
    if nccl.found:
        print(f"NCCL {nccl.found.version_string} ({nccl.found.version}) from {nccl.found.path} [{nccl.found.source}]")
    else:
        print(f"NCCL {nccl.describe_failure()}")
    cuda = probe_cuda()
    if cuda.driver:
        print(f"CUDA driver {cuda.driver.version_string} at {cuda.driver.path}: "
              f"{cuda.device_count} device(s)" + (f" ({cuda.problem})" if cuda.problem else ""))
    else:
        print(f"CUDA driver: {cuda.problem}")
    rt = cuda.runtime
    print(f"CUDA runtime {rt.version_string} at {rt.path} [{rt.source}]" if rt else "CUDA runtime: not found")


if __name__ == "__main__":
    _main()
