"""collectives.keras DistributedOptimizer(zero_stage=1/2) (sharded optimizer state) on real ranks.

One launch per number of ranks (see ``tests/tensorflow/workers/keras_zero_worker.py`` for the
families): np 2 runs every family; np 3 (buckets padded for 3 ranks, uneven shards of the variables)
model.fit's equivalence, the state, a process set, sharded checkpoints saved at 2 and loaded at
3 and 1, and the refusals.
"""
import pytest

pytest.importorskip("tensorflow")

from mpi_launch import assert_all_ranks_passed, run_workers  # noqa: E402

TIMEOUT = 480  # seconds per launch (np 2 took 208 s at a load of 15 on 2 cores)
ENV = {"TF_CPP_MIN_LOG_LEVEL": "2", "TF_ENABLE_ONEDNN_OPTS": "0", "COLLECTIVES_STALL_SHUTDOWN_TIME_SECONDS": "30"}


def test_keras_zero_np2():
    run = run_workers(2, "keras_zero_worker.py", "equiv", "options", "state", "mixed", "errors", timeout=TIMEOUT,
                      env=ENV)
    assert_all_ranks_passed(run, 2, min_cases=41)


def test_keras_zero_np3():
    run = run_workers(3, "keras_zero_worker.py", "equiv-fit", "state", "sets", "sharded", "errors", timeout=TIMEOUT,
                      env=ENV)
    assert_all_ranks_passed(run, 3, min_cases=26)
