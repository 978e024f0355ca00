"""TensorFlow's DistributedOptimizer / DistributedGradientTape reduce each group of dense
gradients as flat buffers (one per dtype); tests/tensorflow/workers/tf_gradient_buckets_worker.py checks
mixed dtypes, 0-d and empty gradients, every grouping and op, eager and traced, against numpy."""
import pytest

from mpi_launch import assert_all_ranks_passed, run_workers

pytest.importorskip("tensorflow")


def test_flat_buckets_match_numpy():
    run = run_workers(2, "tf_gradient_buckets_worker.py", timeout=300)
    assert_all_ranks_passed(run, 2, min_cases=9)
