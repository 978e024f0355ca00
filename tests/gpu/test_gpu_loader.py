"""The GPU backend on machines without a GPU: the run-time loading of the CUDA driver and
NCCL, the clear error for GPU arrays when either is missing, and the engine's whole NCCL path
driven through stand-in libraries (tests/gpu/fakes: a CUDA driver whose "device memory" is host
memory, NCCL of one rank), compiled here with the C compiler. tests/gpu/test_gpu.py runs the
same code on a real GPU; tests/gpu/test_gpu_api_headers.py checks the declarations against the
real headers.
"""
import os
import shutil
import subprocess
import sys

import pytest

from mpi_launch import assert_all_ranks_passed, run_workers

HERE = os.path.dirname(os.path.abspath(__file__))
FAKES = os.path.join(HERE, "fakes")
CSRC = os.path.join(os.path.dirname(os.path.dirname(HERE)), "csrc")
CC = shutil.which("cc") or shutil.which("gcc")
needs_cc = pytest.mark.skipif(CC is None, reason="no C compiler for the stand-in libraries")


@pytest.fixture(scope="module")
def fake_libs(tmp_path_factory):
    """Directory with libcuda.so.1 and libnccl.so.2 built from tests/gpu/fakes."""
    out = tmp_path_factory.mktemp("fake_gpu")
    for source, name in (("fake_cuda.c", "libcuda.so.1"), ("fake_nccl.c", "libnccl.so.2")):
        subprocess.run([CC, "-shared", "-fPIC", "-O1", f"-I{CSRC}", "-o", str(out / name), os.path.join(FAKES, source),
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


# The engine's GPU runtime rules (tests/gpu/workers/gpu_fake_runtime_worker.py).

@needs_cc
def test_a_local_failure_fails_every_member_before_launch(fake_libs):
    run = run_workers(2, "gpu_fake_runtime_worker.py", "agreement", timeout=120,
                      env=_fake_env(fake_libs, FAKE_NCCL_ANY_RANKS="1"))
    assert_all_ranks_passed(run, 2, min_cases=6)


@needs_cc
def test_gpu_waits_end_after_the_stall_shutdown_time(fake_libs):
    run = run_workers(1, "gpu_fake_runtime_worker.py", "timeout", timeout=120,
                      env=_fake_env(fake_libs, COLLECTIVES_STALL_SHUTDOWN_TIME_SECONDS="2"))
    assert_all_ranks_passed(run, 1, min_cases=3)


@needs_cc
def test_removing_a_process_set_destroys_its_communicator(fake_libs):
    run = run_workers(2, "gpu_fake_runtime_worker.py", "release", timeout=120, env=_fake_env(fake_libs))
    assert_all_ranks_passed(run, 2, min_cases=2)


@needs_cc
def test_nccl_in_progress_is_waited_out(fake_libs):
    run = run_workers(1, "gpu_fake_runtime_worker.py", "inprogress", timeout=120, env=_fake_env(fake_libs))
    assert_all_ranks_passed(run, 1, min_cases=8)


@needs_cc
def test_no_lock_is_held_across_ncclgroupend(fake_libs):
    run = run_workers(1, "gpu_fake_runtime_worker.py", "unlocked", timeout=120, env=_fake_env(fake_libs))
    assert_all_ranks_passed(run, 1, min_cases=1)


@needs_cc
def test_no_context_is_retained_on_another_gpu(fake_libs):
    run = run_workers(1, "gpu_fake_runtime_worker.py", "contexts", timeout=120,
                      env=_fake_env(fake_libs, FAKE_CUDA_DEVICES="2", FAKE_CUDA_POINTER_DEVICE="1"))
    assert_all_ranks_passed(run, 1, min_cases=3)


@needs_cc
def test_engine_buffers_empty_arrays_and_dlpack_copies(fake_libs):
    run = run_workers(1, "gpu_fake_runtime_worker.py", "buffers", timeout=120, env=_fake_env(fake_libs))
    assert_all_ranks_passed(run, 1, min_cases=5)


@needs_cc
def test_fused_groups_use_the_batched_copy_kernel(fake_libs):
    run = run_workers(1, "gpu_fake_runtime_worker.py", "kernel", timeout=180, env=_fake_env(fake_libs))
    assert_all_ranks_passed(run, 1, min_cases=3)


@needs_cc
def test_without_the_kernel_fused_groups_copy(fake_libs):
    run = run_workers(1, "gpu_fake_runtime_worker.py", "kernel", timeout=180,
                      env=_fake_env(fake_libs, FAKE_CUDA_NO_MODULES="1", KERNEL_EXPECTED="0"))
    assert_all_ranks_passed(run, 1, min_cases=3)


@needs_cc
@pytest.mark.parametrize("wait,wait_ms", [("1", "100"), ("0", "100"), ("1", "0")])
def test_gpu_work_arriving_while_the_gpu_is_busy_fuses(fake_libs, wait, wait_ms):
    # Each collective "runs" 200 ms; held work waits at most COLLECTIVES_GPU_FUSION_WAIT_MS.
    # COLLECTIVES_GPU_FUSION_WAIT=0, or a wait of 0 ms: nothing waits (the worker expects many
    # NCCL calls).
    run = run_workers(1, "gpu_fake_fusion_worker.py", "busy", timeout=120,
                      env=_fake_env(fake_libs, COLLECTIVES_GPU_FUSION_WAIT=wait, COLLECTIVES_GPU_FUSION_WAIT_MS=wait_ms))
    assert_all_ranks_passed(run, 1, min_cases=4)


@needs_cc
@pytest.mark.parametrize("wait_ms", ["100", "0"])
def test_gpu_work_held_on_two_ranks_fuses_alike(fake_libs, wait_ms):
    # Each rank holds its own burst; whichever cycle starts first takes the other rank's held
    # work along. Both ranks must make the same NCCL calls, few with the wait, many without.
    run = run_workers(2, "gpu_fake_fusion_worker.py", "busy_two_ranks", timeout=120,
                      env=_fake_env(fake_libs, FAKE_NCCL_ANY_RANKS="1", COLLECTIVES_GPU_FUSION_WAIT_MS=wait_ms))
    assert_all_ranks_passed(run, 2, min_cases=1)


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
