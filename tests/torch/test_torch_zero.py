"""DistributedOptimizer(zero_stage=1/2) (sharded optimizer state and gradients) on real ranks.

One launch per number of ranks (see ``tests/torch/workers/torch_zero_worker.py`` for the families):
np 2 (bitwise against the unsharded optimizer) writes a sharded checkpoint that np 3 (uneven
bucket sizes, a process set) and np 1 load.
"""
import pytest

from mpi_launch import assert_all_ranks_passed, run_workers

pytest.importorskip("torch")

TIMEOUT = 150  # seconds per launch
ENV = {"COLLECTIVES_STALL_SHUTDOWN_TIME_SECONDS": "30"}


def test_torch_zero(tmp_path):
    directory = str(tmp_path / "ckpt")
    run = run_workers(2, "torch_zero_worker.py", "equiv", "more", "clip", "ckpt", "errors", "reuse",
                      f"save:{directory}", timeout=TIMEOUT, env=ENV)
    assert_all_ranks_passed(run, 2, min_cases=37)
    run = run_workers(3, "torch_zero_worker.py", "equiv", "more", "ckpt", "errors", "sets", "reuse",
                      f"load:{directory}", timeout=TIMEOUT, env=ENV)
    assert_all_ranks_passed(run, 3, min_cases=33)
    run = run_workers(1, "torch_zero_worker.py", f"load:{directory}", "ckpt", timeout=TIMEOUT, env=ENV)
    assert_all_ranks_passed(run, 1, min_cases=6)


def test_torch_zero_grad_scaler():
    # np 2 bitwise against the unsharded optimizer; np 3 uneven buckets, three summands
    for np in (2, 3):
        run = run_workers(np, "torch_zero_amp_worker.py", timeout=TIMEOUT, env=ENV)
        assert_all_ranks_passed(run, np, min_cases=8)
