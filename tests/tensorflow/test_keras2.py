"""Keras 2 (tf_keras) with collectives.keras and collectives.tensorflow on real ranks.

Two mpirun launches of ``tests/tensorflow/workers/keras2_worker.py`` (see its docstring): one with
``TF_USE_LEGACY_KERAS=1`` (tf.keras is tf_keras: DistributedOptimizer on new-style, legacy and
custom optimizers in fit and custom loops against one process on the whole batch, every
callback, broadcast_variables, load_model, elastic KerasState, Horovod's TF2 Keras MNIST
example), one importing tf_keras directly beside Keras 3 (each object keeps its own Keras).
"""
import pytest

pytest.importorskip("tensorflow")
pytest.importorskip("tf_keras")

from mpi_launch import assert_all_ranks_passed, run_workers  # noqa: E402

TF_ENV = {"TF_CPP_MIN_LOG_LEVEL": "2", "TF_ENABLE_ONEDNN_OPTS": "0"}
TIMEOUT = 600  # one launch of 30-odd cases: 280-330 s with TF 2.16 on 2 cores busy with other jobs (load 15-20)


def test_keras2_with_tf_use_legacy_keras(tmp_path):
    run = run_workers(2, "keras2_worker.py", "env", tmp_path, timeout=TIMEOUT,
                      env=dict(TF_ENV, TF_USE_LEGACY_KERAS="1"))
    assert_all_ranks_passed(run, 2, min_cases=31)


def test_keras2_imported_directly_beside_keras3(tmp_path):
    run = run_workers(2, "keras2_worker.py", "direct", tmp_path, timeout=TIMEOUT,
                      env=dict(TF_ENV, TF_USE_LEGACY_KERAS=""))
    assert_all_ranks_passed(run, 2, min_cases=5)
