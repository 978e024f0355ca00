"""The GPU backend on machines without a GPU: the run-time loading of the CUDA driver and
NCCL, the clear error for GPU arrays when either is missing, and the engine's whole NCCL path
driven through stand-in libraries (tests/fakes: a CUDA driver whose "device memory" is host
memory, NCCL of one rank), compiled here with the C compiler. tests/test_gpu.py runs the
same code on a real GPU.
"""
import ctypes
import os
import shutil
import subprocess
import sys

import pytest

from mpi_launch import assert_all_ranks_passed, run_workers

HERE = os.path.dirname(os.path.abspath(__file__))
FAKES = os.path.join(HERE, "fakes")
CC = shutil.which("cc") or shutil.which("gcc")
CXX = shutil.which("c++") or shutil.which("g++")
needs_cc = pytest.mark.skipif(CC is None, reason="no C compiler for the stand-in libraries")


def _driver_present():
    try:
        ctypes.CDLL("libcuda.so.1")
        return True
    except OSError:
        return False


@pytest.fixture(scope="module")
def fake_libs(tmp_path_factory):
    """Directory with libcuda.so.1 and libnccl.so.2 built from tests/fakes."""
    out = tmp_path_factory.mktemp("fake_gpu")
    for source, name in (("fake_cuda.c", "libcuda.so.1"), ("fake_nccl.c", "libnccl.so.2")):
        subprocess.run([CC, "-shared", "-fPIC", "-O1", "-o", str(out / name), os.path.join(FAKES, source),
                        f"-Wl,-soname,{name}"], check=True, timeout=120)
    return str(out)


def _fake_env(fake_libs, **extra):
    env = {"LD_LIBRARY_PATH": os.pathsep.join(filter(None, [fake_libs, os.environ.get("LD_LIBRARY_PATH")])),
           "COLLECTIVES_NCCL_LIBRARY": os.path.join(fake_libs, "libnccl.so.2")}
    env.update(extra)
    return env


def test_gpu_arrays_without_nccl_give_a_clear_error():
    # NCCL is made unfindable (and on this machine there is no CUDA driver either).
    run = run_workers(1, "gpu_fake_worker.py", "nolibs", timeout=120,
                      env={"COLLECTIVES_NCCL_LIBRARY": "/nonexistent/libnccl.so.2"})
    assert_all_ranks_passed(run, 1, min_cases=6)


@needs_cc
def test_cuinit_failure_is_an_exception(fake_libs):
    run = run_workers(1, "gpu_fake_worker.py", "cuinit", timeout=120,
                      env=_fake_env(fake_libs, FAKE_CUDA_INIT_ERROR="100"))
    assert_all_ranks_passed(run, 1, min_cases=2)


@needs_cc
def test_nccl_path_end_to_end_with_stand_in_libraries(fake_libs):
    run = run_workers(1, "gpu_fake_worker.py", "fake", timeout=180, env=_fake_env(fake_libs, FAKE_CUDA_DEVICES="2"))
    assert_all_ranks_passed(run, 1, min_cases=20)


@needs_cc
def test_nccl_failures_become_exceptions(fake_libs):
    run = run_workers(2, "gpu_fake_worker.py", "failures", timeout=120, env=_fake_env(fake_libs))
    assert_all_ranks_passed(run, 2, min_cases=3)


@needs_cc
def test_communicator_creation_failure_reaches_every_rank(fake_libs):
    run = run_workers(2, "gpu_fake_worker.py", "initfailure", timeout=120, env=_fake_env(fake_libs))
    assert_all_ranks_passed(run, 2, min_cases=3)


@needs_cc
def test_missing_symbol_is_reported(fake_libs, tmp_path):
    # A "libnccl.so.2" that answers ncclGetVersion but lacks the rest (an NCCL too old, or
    # another library): the reason names the first missing entry point.
    lib = tmp_path / "libnccl.so.2"
    src = tmp_path / "old.c"
    src.write_text("int ncclGetVersion(int *v) { *v = 2708; return 0; }\n")
    subprocess.run([CC, "-shared", "-fPIC", "-o", str(lib), str(src)], check=True, timeout=60)
    code = ("import collectives as hvd\nfrom collectives._loader import engine_module\nhvd.init()\n"
            "info = engine_module().gpu_info()\nprint(info['problem'])\n"
            "assert not info['available'] and info['cuda_found'], info\n"
            "assert 'ncclGetUniqueId' in info['problem'] and '2.7.8' in info['problem'], info\n"
            "assert hvd.nccl_built() == 0\nhvd.shutdown()\n")
    env = dict(os.environ, **_fake_env(fake_libs, COLLECTIVES_NCCL_LIBRARY=str(lib)))
    proc = subprocess.run([sys.executable, "-c", code], env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr


CUDA_H_CHECK = r"""
#include <cuda.h>
#include "gpu_api.h"
namespace g = collectives::gpu;
static_assert(g::CUDA_SUCCESS == CUDA_SUCCESS, "CUDA_SUCCESS");
static_assert(g::CUDA_ERROR_NOT_READY == CUDA_ERROR_NOT_READY, "CUDA_ERROR_NOT_READY");
static_assert(g::CU_STREAM_NON_BLOCKING == CU_STREAM_NON_BLOCKING, "CU_STREAM_NON_BLOCKING");
static_assert(g::CU_EVENT_DISABLE_TIMING == CU_EVENT_DISABLE_TIMING, "CU_EVENT_DISABLE_TIMING");
static_assert(g::CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL == CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, "DEVICE_ORDINAL");
static_assert(sizeof(g::CUdeviceptr) == sizeof(CUdeviceptr), "CUdeviceptr");
static_assert(sizeof(g::CUresult) == sizeof(CUresult), "CUresult");
static_assert(sizeof(g::CUdevice) == sizeof(CUdevice), "CUdevice");
"""


@pytest.mark.skipif(CXX is None or not os.path.exists("/usr/local/cuda/include/cuda.h"),
                    reason="needs a C++ compiler and a CUDA toolkit's cuda.h")
def test_declarations_match_cuda_h(tmp_path):
    # gpu_api.h declares the driver API without cuda.h; where a toolkit is installed, check the
    # constants and that every symbol we dlsym exists under that name.
    names = ["cuInit", "cuDriverGetVersion", "cuDeviceGetCount", "cuDeviceGet", "cuDevicePrimaryCtxRetain",
             "cuCtxSetCurrent", "cuCtxPushCurrent_v2", "cuCtxPopCurrent_v2", "cuCtxGetStreamPriorityRange",
             "cuStreamCreateWithPriority", "cuStreamDestroy_v2", "cuStreamSynchronize", "cuStreamWaitEvent",
             "cuEventCreate", "cuEventDestroy_v2", "cuEventRecord", "cuEventQuery", "cuMemAlloc_v2", "cuMemFree_v2",
             "cuMemAllocAsync", "cuMemFreeAsync", "cuMemcpyDtoDAsync_v2", "cuMemcpyDtoHAsync_v2",
             "cuMemcpyHtoDAsync_v2", "cuMemsetD8Async", "cuPointerGetAttribute", "cuGetErrorName",
             "cuGetErrorString"]
    src = tmp_path / "check.cc"
    body = CUDA_H_CHECK
    # cuda.h maps the plain names to the _v2 ones with macros; the _v2 names are real declarations.
    body += "".join(f"static auto* p_{n} = &::{n};\n" for n in names)
    body += "int main() { return 0; }\n"
    src.write_text(body)
    proc = subprocess.run([CXX, "-std=c++17", "-fsyntax-only", "-I/usr/local/cuda/include",
                           f"-I{os.path.join(os.path.dirname(HERE), 'csrc')}", str(src)],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
