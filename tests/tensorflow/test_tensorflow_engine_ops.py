"""The engine's own TensorFlow op for gradients (csrc/tensorflow/tensorflow_kernels.cc), registered through
TensorFlow's C API: DistributedGradientTape and Keras DistributedOptimizer inside a tf.function
use it (and with COLLECTIVES_TENSORFLOW_KERNELS=0 a tf.py_function instead), with results equal
to numpy references and to single-process Keras training, a process set, an error on every rank
when the ranks disagree, shutdown/init around a traced step, and shutdown while a step waits (tests/tensorflow/workers/tf_engine_ops_worker.py).
Mixed dtypes, 0-d and empty gradients and groupings through the op: test_tf_gradient_buckets.py."""
import pytest

from mpi_launch import assert_all_ranks_passed, run_workers

pytest.importorskip("tensorflow")


def test_gradients_through_the_engine_op():
    # Three ranks: a process set of two that is not the global set.
    run = run_workers(3, "tf_engine_ops_worker.py", "op", timeout=240)
    assert_all_ranks_passed(run, 3, min_cases=6)


def test_gradients_through_py_function_when_the_op_is_off():
    run = run_workers(2, "tf_engine_ops_worker.py", "fallback", timeout=240,
                      env={"COLLECTIVES_TENSORFLOW_KERNELS": "0"})
    assert_all_ranks_passed(run, 2, min_cases=6)
