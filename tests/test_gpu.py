"""GPU tests: tests/workers/gpu_worker.py on real GPUs through NCCL (skipped cleanly without a
CUDA GPU), and the same checks on CPU tensors everywhere, so that they stay right on machines
without one. scripts/gpu-check.sh runs these on a GPU machine.

Ranks: COLLECTIVES_GPU_TEST_NP (default 2 with two GPUs or more, else 1). With
COLLECTIVES_TEST_SHARED_GPU=1 the ranks share one GPU (each poses as its own host to NCCL).
"""
import os

import pytest

torch = pytest.importorskip("torch")

from mpi_launch import assert_all_ranks_passed, run_workers  # noqa: E402


def _gpus():
    try:
        return torch.cuda.device_count() if torch.cuda.is_available() else 0
    except Exception:  # a broken driver counts as none
        return 0


GPUS = _gpus()
NP = int(os.environ.get("COLLECTIVES_GPU_TEST_NP") or (2 if GPUS >= 2 else 1))
needs_gpu = pytest.mark.skipif(GPUS == 0, reason="no CUDA GPU (torch.cuda.is_available() is False)")

FAMILIES = {"ops": 100, "autograd": 5, "cupy": 0, "streams": 3, "fusion": 2, "optimizer": 10, "errors": 1}


@needs_gpu
@pytest.mark.parametrize("family", list(FAMILIES))
def test_gpu(family):
    run = run_workers(NP, "gpu_worker.py", family, timeout=600)
    assert_all_ranks_passed(run, NP, min_cases=FAMILIES[family] if (family != "errors" or NP > 1) else 0)


def test_gpu_checks_hold_on_cpu():
    # The GPU worker's references, splits and training-equivalence logic on the host path.
    run = run_workers(2, "gpu_worker.py", "ops", "autograd", "fusion", "optimizer", "errors", timeout=300,
                      env={"GPU_TEST_DEVICE": "cpu"})
    assert_all_ranks_passed(run, 2, min_cases=100)
