"""collectives.tensorflow.SyncBatchNormalization (Keras 3; issue 11 item 10) on 2 and 3 real
MPI ranks against numpy batch normalization over the concatenated batches of all ranks:
outputs, moving statistics and input/gamma/beta gradients, eagerly and in tf.function, with
equal, uneven and empty shares, 4-D and masked inputs; fused=True refused; config round trip;
at 2 ranks also model.fit with DistributedOptimizer against one process on the whole batch.
See tests/tensorflow/workers/keras_sync_bn_worker.py."""
import importlib.util

import pytest

from mpi_launch import assert_all_ranks_passed, run_workers

# find_spec, not importorskip: the ranks import TensorFlow, pytest need not (seconds saved).
pytestmark = pytest.mark.skipif(importlib.util.find_spec("tensorflow") is None, reason="TensorFlow not installed")

TF_ENV = {"TF_CPP_MIN_LOG_LEVEL": "2", "TF_ENABLE_ONEDNN_OPTS": "0", "COLLECTIVES_STALL_SHUTDOWN_TIME_SECONDS": "60"}


@pytest.mark.parametrize("np_", [2, 3])
def test_keras_sync_batch_normalization(np_):
    extra = ["fit"] if np_ == 2 else []  # model.fit equivalence once (the slowest case)
    run = run_workers(np_, "keras_sync_bn_worker.py", *extra, timeout=240, env=TF_ENV)
    assert_all_ranks_passed(run, np_, min_cases=10 if extra else 9)
