"""GPU tests: tests/gpu/workers/gpu_worker.py on real GPUs through NCCL (skipped cleanly without a
CUDA GPU), and the same checks on CPU tensors everywhere, so that they stay right on machines
without one. scripts/gpu-check.sh runs these on a GPU machine.

Ranks: COLLECTIVES_GPU_TEST_NP (default 2 with two GPUs or more, else 1). With
COLLECTIVES_TEST_SHARED_GPU=1 the ranks share one GPU (each poses as its own host to NCCL).
COLLECTIVES_GPU_TEST_TIMEOUT: seconds per launch (default 600).

Each family must run exactly the number of cases listed here on every rank (the worker
prints "[rank R] family F: N cases"): a family that silently ran fewer fails, and one that
gained cases makes this list be updated.
"""
import importlib.util
import os
import re

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
TIMEOUT = int(os.environ.get("COLLECTIVES_GPU_TEST_TIMEOUT") or 600)
needs_gpu = pytest.mark.skipif(GPUS == 0, reason="no CUDA GPU (torch.cuda.is_available() is False)")

# Cases per family on a GPU with two ranks or more.
FAMILIES = {"ops": 97, "autograd": 5, "cupy": 3, "streams": 3, "fusion": 2, "optimizer": 10, "zero": 6, "errors": 2}


def expected_cases(family, on_gpu, np):
    """What the worker runs: some families need a GPU, CuPy, or a second rank."""
    if family == "cupy":
        return FAMILIES[family] if on_gpu and importlib.util.find_spec("cupy") else 0
    if family == "streams":
        return FAMILIES[family] if on_gpu else 0
    if family == "errors":
        return 0 if np < 2 else (2 if on_gpu else 1)  # the GPU/CPU mismatch needs a GPU
    return FAMILIES[family]


def family_counts(run, np):
    """{family: [cases on rank 0, rank 1, ...]} from the worker's lines."""
    counts = {}
    for rank, family, n in re.findall(r"\[rank (\d+)\] family (\w+): (\d+) cases", run.stdout):
        counts.setdefault(family, [None] * np)[int(rank)] = int(n)
    return counts


def assert_family_counts(run, np, families, on_gpu):
    counts = family_counts(run, np)
    for family in families:
        want = expected_cases(family, on_gpu, np)
        assert counts.get(family) == [want] * np, (
            f"family {family}: cases per rank {counts.get(family)}, expected {want} on each of {np} "
            f"(tests/gpu/test_gpu.py FAMILIES)\n{run.describe()}")


@needs_gpu
@pytest.mark.parametrize("family", list(FAMILIES))
def test_gpu(family):
    run = run_workers(NP, "gpu_worker.py", family, timeout=TIMEOUT)
    assert_all_ranks_passed(run, NP, min_cases=0)
    assert_family_counts(run, NP, [family], on_gpu=True)


CPU_FAMILIES = ["ops", "autograd", "fusion", "optimizer", "zero", "errors"]


def test_gpu_checks_hold_on_cpu():
    # The GPU worker's references, splits and training-equivalence logic on the host path;
    # the families whose cases do not depend on the device run as many as on a GPU.
    run = run_workers(2, "gpu_worker.py", *CPU_FAMILIES, timeout=300, env={"GPU_TEST_DEVICE": "cpu"})
    assert_all_ranks_passed(run, 2, min_cases=100)
    assert_family_counts(run, 2, CPU_FAMILIES, on_gpu=False)


def test_expected_counts_follow_the_machine():
    assert expected_cases("errors", True, 1) == 0 and expected_cases("errors", True, 2) == 2
    assert expected_cases("streams", False, 2) == 0 and expected_cases("ops", False, 1) == FAMILIES["ops"]
