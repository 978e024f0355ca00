"""Differences from Horovod 0.28.1's ``horovod.torch`` found by the differential test, now
matched (see tests/torch/workers/torch_horovod_parity_worker.py for each case): stateless
broadcast_optimizer_state, handles released by synchronize, ProcessSet.rank() outside the set,
exception types, Horovod's submodules, grouped result types, Compression.fp16's ctx and
mpi_enabled() before init. One launch of 2 real MPI ranks."""
import pytest

from mpi_launch import assert_all_ranks_passed, run_workers

pytest.importorskip("torch")

FAMILIES = ["stateless", "handles", "psrank", "errtypes", "submodules", "small"]


def test_torch_horovod_parity():
    run = run_workers(2, "torch_horovod_parity_worker.py", *FAMILIES, timeout=120,
                      env={"COLLECTIVES_STALL_SHUTDOWN_TIME_SECONDS": "30"})
    assert_all_ranks_passed(run, 2, min_cases=18)
