"""csrc/gpu/gpu_api.h against the real CUDA and NCCL headers and libraries.

The engine declares the CUDA driver and NCCL entry points itself (so that it builds without
CUDA). tests/gpu/gpu_api_check.cc static_asserts every one of them against cuda.h and nccl.h:
the symbol each API name is bound to, each function type, each constant and struct size.
These tests build and run it wherever the headers are found, and skip, saying which header
is missing, where they are not: cuda.h comes with a CUDA toolkit ($CUDA_HOME, nvcc's, or
/usr/local/cuda*), nccl.h with the nvidia-nccl-cu* wheel (nvidia/nccl/include on sys.path),
the system, or $COLLECTIVES_NCCL_INCLUDE. scripts/gpu-check.sh runs them on the GPU machine.
"""
import glob
import json
import os
import re
import shutil
import subprocess
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
GPU_SRC = os.path.join(os.path.dirname(os.path.dirname(HERE)), "csrc", "gpu")  # gpu_api.h, included by its name
CHECK = os.path.join(HERE, "gpu_api_check.cc")
CXX = shutil.which("c++") or shutil.which("g++") or shutil.which("clang++")


def _first_with(filename, dirs):
    for d in dirs:
        if d and os.path.isfile(os.path.join(d, filename)):
            return d
    return None


def _wheel_include_dirs(*patterns):
    dirs = []
    for entry in sys.path:
        for pattern in patterns:
            dirs += sorted(glob.glob(os.path.join(entry, pattern)))
    return dirs


def cuda_include_dir():
    """A CUDA toolkit's include directory (cuda.h and cuda_runtime.h), or None."""
    dirs = [os.path.join(os.environ[v], "include") for v in ("CUDA_HOME", "CUDA_PATH") if os.environ.get(v)]
    nvcc = shutil.which("nvcc")
    if nvcc:
        dirs.append(os.path.join(os.path.dirname(os.path.dirname(os.path.realpath(nvcc))), "include"))
    dirs += ["/usr/local/cuda/include"] + sorted(glob.glob("/usr/local/cuda-*/include"), reverse=True)
    dirs += _wheel_include_dirs("nvidia/cu*/include", "nvidia/cuda_runtime/include") + ["/usr/include"]
    return next((d for d in dirs if _first_with("cuda.h", [d]) and _first_with("cuda_runtime.h", [d])), None)


def nccl_include_dir():
    dirs = [os.environ.get("COLLECTIVES_NCCL_INCLUDE")] + _wheel_include_dirs("nvidia/nccl/include", "nvidia/*/include")
    cuda = cuda_include_dir()
    dirs += [cuda, "/usr/include", "/usr/local/include"]
    return _first_with("nccl.h", dirs)


CUDA_INCLUDE = cuda_include_dir()
NCCL_INCLUDE = nccl_include_dir()
needs_cxx = pytest.mark.skipif(CXX is None, reason="no C++ compiler")
needs_cuda_h = pytest.mark.skipif(CUDA_INCLUDE is None,
                                  reason="no CUDA toolkit headers (cuda.h, cuda_runtime.h): set CUDA_HOME")
needs_nccl_h = pytest.mark.skipif(CUDA_INCLUDE is None or NCCL_INCLUDE is None,
                                  reason="no nccl.h (install nvidia-nccl-cu13, or set COLLECTIVES_NCCL_INCLUDE) "
                                         "or no CUDA toolkit headers for it")


def build_and_run(tmp_path, defines, api_dir=GPU_SRC):
    """(ok, output) of compiling tests/gpu/gpu_api_check.cc against the headers and running it."""
    includes = [f"-I{d}" for d in (CUDA_INCLUDE, NCCL_INCLUDE if "CHECK_NCCL" in defines else None) if d]
    exe = tmp_path / "gpu_api_check"
    proc = subprocess.run([CXX, "-std=c++17", "-Wall", *[f"-D{d}" for d in defines], *includes, f"-I{api_dir}",
                           CHECK, "-o", str(exe)], capture_output=True, text=True, timeout=180)
    if proc.returncode != 0:
        return False, proc.stdout + proc.stderr
    run = subprocess.run([str(exe)], capture_output=True, text=True, timeout=60)
    return run.returncode == 0, run.stdout + run.stderr


def entry_points():
    """{"cuda": [(member, symbol, required)], "nccl": [...]} from gpu_api.h's lists."""
    text = open(os.path.join(GPU_SRC, "gpu_api.h")).read()
    out = {}
    for kind, macro in (("cuda", "COLLECTIVES_CUDA_ENTRY_POINTS"), ("nccl", "COLLECTIVES_NCCL_ENTRY_POINTS")):
        body = text[text.index(f"#define {macro}(X)"):]
        body = body[:body.index("\n\n")]
        out[kind] = [(m, s, r == "true") for m, s, r in re.findall(r"X\((\w+), (\w+), (true|false)\)", body)]
    return out


@needs_cxx
@needs_cuda_h
def test_declarations_match_cuda_h(tmp_path):
    ok, output = build_and_run(tmp_path, ["CHECK_CUDA"])
    assert ok, output
    assert f"{len(entry_points()['cuda'])} entry points match" in output, output


@needs_cxx
@needs_nccl_h
def test_declarations_match_nccl_h(tmp_path):
    ok, output = build_and_run(tmp_path, ["CHECK_NCCL"])
    assert ok, output
    assert f"{len(entry_points()['nccl'])} entry points match" in output, output


MUTATIONS = [  # (what is changed in gpu_api.h, to what, what the check must say)
    ("CHECK_CUDA", "X(CtxPushCurrent, cuCtxPushCurrent_v2, true)", "X(CtxPushCurrent, cuCtxPushCurrent, true)",
     "cuda.h binds cuCtxPushCurrent to another symbol"),
    ("CHECK_CUDA", "(CUdeviceptr dst, unsigned char value, size_t n, CUstream s)",
     "(CUdeviceptr dst, int value, size_t n, CUstream s)", "CudaApi::MemsetD8Async does not match"),
    ("CHECK_CUDA", "CUresult (*EventQuery)(CUevent e);", "CUresult (*EventQuery)(CUstream e);",
     "CudaApi::EventQuery does not match"),
    ("CHECK_CUDA", "CUDA_ERROR_NOT_READY = 600", "CUDA_ERROR_NOT_READY = 601", "CUDA_ERROR_NOT_READY"),
    ("CHECK_NCCL", "kNcclUniqueIdBytes = 128", "kNcclUniqueIdBytes = 120", "NCCL_UNIQUE_ID_BYTES"),
    ("CHECK_NCCL", "ncclBfloat16 = 9", "ncclBfloat16 = 10", "ncclBfloat16"),
    ("CHECK_NCCL", "int dtype, int root, ncclComm comm, CUstream s);\n  ncclResult (*Reduce)",
     "int dtype, int root, ncclComm comm);\n  ncclResult (*Reduce)", "NcclApi::Broadcast does not match"),
]


@needs_cxx
@pytest.mark.parametrize("define,old,new,message", MUTATIONS, ids=[m[3] for m in MUTATIONS])
def test_the_check_catches_a_wrong_declaration(tmp_path, define, old, new, message):
    if CUDA_INCLUDE is None or (define == "CHECK_NCCL" and NCCL_INCLUDE is None):
        pytest.skip("needs the headers (see the tests above)")
    text = open(os.path.join(GPU_SRC, "gpu_api.h")).read()
    assert text.count(old) == 1, f"{old!r} is no longer in gpu_api.h: update this test"
    (tmp_path / "gpu_api.h").write_text(text.replace(old, new))
    ok, output = build_and_run(tmp_path, [define], api_dir=str(tmp_path))
    assert not ok and message in output, output


EXPORTS = """
import ctypes, json, sys
from collectives import gpu_libs
names = json.loads(sys.argv[1])
found = {}
try:
    cuda = ctypes.CDLL(gpu_libs.CUDA_DRIVER_SONAME)
except OSError:
    cuda = None
info = gpu_libs.find_nccl()
nccl = ctypes.CDLL(info.path) if info else None
for kind, lib in (("cuda", cuda), ("nccl", nccl)):
    # The stand-ins of tests/gpu/fakes prove nothing about the real libraries.
    if lib is not None and not hasattr(lib, "fake_cuda_count") and not hasattr(lib, "fake_nccl_count"):
        found[kind] = [s for s in names[kind] if not hasattr(lib, s)]
print(json.dumps(found))
"""


def test_every_entry_point_is_exported_by_the_real_libraries():
    # What dlsym will find: the required names must all be there (the optional ones may not).
    # In a process of its own: libraries loaded here earlier (stand-ins) would answer instead.
    required = {kind: [s for _, s, req in points if req] for kind, points in entry_points().items()}
    proc = subprocess.run([sys.executable, "-c", EXPORTS, json.dumps(required)], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr
    missing = json.loads(proc.stdout.strip().splitlines()[-1])
    if not missing:
        pytest.skip("neither a real CUDA driver nor a real NCCL is installed here")
    assert all(not names for names in missing.values()), f"not exported: {missing}"


def test_entry_point_lists_parse():
    # The lists the tests above read (a change of their layout must not make them check nothing).
    lists = entry_points()
    assert len(lists["cuda"]) >= 30 and len(lists["nccl"]) >= 19, lists
    assert ("CtxPushCurrent", "cuCtxPushCurrent_v2", True) in lists["cuda"]
    assert ("GetLastError", "ncclGetLastError", False) in lists["nccl"]
