"""collectives.gpu_libs: the NCCL search order (env var, nvidia wheel layout, system), version
decoding, the CUDA driver probe, and never raising when nothing is there. Stand-in libraries
with the real entry points are compiled with the C compiler, so no GPU is needed."""
import os
import shutil
import subprocess
import sys

import pytest

from collectives import gpu_libs

CC = shutil.which("cc") or shutil.which("gcc")
needs_cc = pytest.mark.skipif(CC is None, reason="no C compiler for the stand-in libraries")

FAKE_NCCL = "int ncclGetVersion(int *v) { *v = %d; return 0; }\n"
FAKE_CUDART = "int cudaRuntimeGetVersion(int *v) { *v = 12080; return 0; }\n"
FAKE_DRIVER = """
int cuDriverGetVersion(int *v) { *v = 12040; return 0; }
int cuInit(unsigned flags) { return %d; }
int cuDeviceGetCount(int *c) { *c = 2; return 0; }
int cuGetErrorName(int code, const char **name) { *name = "CUDA_ERROR_NO_DEVICE"; return 0; }
"""


def compile_library(path, source, soname):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    src = str(path) + ".c"
    with open(src, "w") as f:
        f.write(source)
    subprocess.run([CC, "-shared", "-fPIC", "-o", str(path), src, f"-Wl,-soname,{soname}"], check=True, timeout=60)
    return str(path)


NOTHING_FOUND = """
from collectives import gpu_libs
# Nothing to find: no wheel directories, no system search, a driver path that does not exist.
search = gpu_libs.search_nccl(environ={}, search_paths=[], include_system=False)
assert search.found is None and search.attempts == (), search
assert "not found" in search.describe_failure()
assert gpu_libs.find_nccl(environ={}, search_paths=[], include_system=False) is None
cuda = gpu_libs.probe_cuda(search_paths=[], driver="/nonexistent/libcuda.so.1")
assert not cuda.available and cuda.device_count == 0 and cuda.driver is None, cuda
assert "/nonexistent/libcuda.so.1" in cuda.problem, cuda.problem
print("ok")
"""


def test_nothing_found_is_not_an_error():
    # Answers, not exceptions, when nothing is there.
    exec(compile(NOTHING_FOUND, "<nothing found>", "exec"), {})


@needs_cc
def test_nothing_found_even_where_a_driver_and_nccl_are_installed(tmp_path):
    # The same probes on a machine that has a CUDA driver and a system NCCL (stand-ins the
    # dynamic loader finds by soname): the test above must not depend on the machine.
    libs = tmp_path / "libs"
    compile_library(libs / "libcuda.so.1", FAKE_DRIVER % 0, "libcuda.so.1")
    compile_library(libs / "libnccl.so.2", FAKE_NCCL % 22105, "libnccl.so.2")
    env = dict(os.environ, LD_LIBRARY_PATH=os.pathsep.join(filter(None, [str(libs), os.environ.get("LD_LIBRARY_PATH")])))
    env.pop(gpu_libs.NCCL_ENV, None)
    # The defaults do find them here...
    found = subprocess.run([sys.executable, "-c", "from collectives import gpu_libs; "
                            "print(gpu_libs.find_nccl(environ={}, search_paths=[]).version, "
                            "gpu_libs.probe_cuda(search_paths=[]).device_count)"],
                           env=env, capture_output=True, text=True, timeout=60)
    assert found.stdout.split() == ["22105", "2"], found.stdout + found.stderr
    # ...and the probes that ask for nothing still find nothing.
    proc = subprocess.run([sys.executable, "-c", NOTHING_FOUND], env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and "ok" in proc.stdout, proc.stdout + proc.stderr


def test_candidate_order(tmp_path):
    lib = tmp_path / "nvidia" / "nccl" / "lib" / "libnccl.so.2"
    lib.parent.mkdir(parents=True)
    lib.write_bytes(b"")
    order = gpu_libs.nccl_candidates(environ={}, search_paths=[str(tmp_path)])
    assert order[0] == ("wheel", str(lib))
    assert order[-1] == ("system", "libnccl.so.2")
    # The variable, when set, is the only candidate: a wrong value is reported, not replaced.
    assert gpu_libs.nccl_candidates(environ={gpu_libs.NCCL_ENV: "/x/libnccl.so"},
                                    search_paths=[str(tmp_path)]) == [("env", "/x/libnccl.so")]


def test_explicit_library_that_does_not_load_is_reported():
    search = gpu_libs.search_nccl(environ={gpu_libs.NCCL_ENV: "/nonexistent/libnccl.so.2"}, search_paths=[])
    assert search.found is None
    assert gpu_libs.NCCL_ENV in search.describe_failure() and "/nonexistent/libnccl.so.2" in search.describe_failure()
    wrong = gpu_libs.search_nccl(environ={gpu_libs.NCCL_ENV: "libc.so.6"}, search_paths=[])
    assert wrong.found is None and "ncclGetVersion" in wrong.describe_failure()


@needs_cc
def test_wheel_then_env(tmp_path):
    wheel = compile_library(tmp_path / "site" / "nvidia" / "nccl" / "lib" / "libnccl.so.2", FAKE_NCCL % 22105,
                            "libnccl.so.2")
    found = gpu_libs.find_nccl(environ={}, search_paths=[str(tmp_path / "site")])
    assert found == gpu_libs.LibInfo(wheel, 22105, "wheel", "2.21.5")
    mine = compile_library(tmp_path / "mine" / "libnccl.so.2", FAKE_NCCL % 2708, "libnccl.so.2")
    found = gpu_libs.find_nccl(environ={gpu_libs.NCCL_ENV: mine}, search_paths=[str(tmp_path / "site")])
    assert (found.path, found.source, found.version_string) == (mine, "env", "2.7.8")


@needs_cc
def test_cuda_driver_and_runtime_probe(tmp_path):
    runtime = compile_library(tmp_path / "site" / "nvidia" / "cuda_runtime" / "lib" / "libcudart.so.12", FAKE_CUDART,
                              "libcudart.so.12")
    driver = compile_library(tmp_path / "drv" / "libcuda.so.1", FAKE_DRIVER % 0, "libcuda.so.1")
    cuda = gpu_libs.probe_cuda(search_paths=[str(tmp_path / "site")], driver=driver)
    assert cuda.available and cuda.device_count == 2 and cuda.problem == ""
    assert (cuda.driver.path, cuda.driver.version_string) == (driver, "12.4")
    assert (cuda.runtime.path, cuda.runtime.source, cuda.runtime.version_string) == (runtime, "wheel", "12.8")
    no_device = compile_library(tmp_path / "drv2" / "libcuda.so.1", FAKE_DRIVER % 100, "libcuda.so.1")
    cuda = gpu_libs.probe_cuda(search_paths=[], driver=no_device)
    assert not cuda.available and "CUDA_ERROR_NO_DEVICE (100)" in cuda.problem


def test_version_strings():
    assert gpu_libs.nccl_version_string(22105) == "2.21.5"
    assert gpu_libs.nccl_version_string(2708) == "2.7.8"
    assert gpu_libs.cuda_version_string(12040) == "12.4"
    assert gpu_libs.cuda_version_string(11080) == "11.8"
