"""Horovod behaviours of collectives.tensorflow and collectives.keras (issue 11) on 3 real MPI
ranks.

One launch per rank count runs ``tests/tensorflow/workers/tf_conformance_worker.py`` with every family
(see its docstring): ccl_built/ddl_built and the other Horovod names, Horovod's reducescatter
gradient, uint16 in the byte-moving collectives, tf.IndexedSlices averages and scale factors,
the TensorFlow exception types of Horovod's ops, ``optimizer.iterations`` under
backward_passes_per_step, and local variables (PartialDistributedGradientTape,
PartialDistributedOptimizer, BroadcastGlobalVariablesCallback(local_variables=...)) --
values against numpy references, errors on every rank, eagerly and in tf.function.
"""
import pytest

pytest.importorskip("tensorflow")

from mpi_launch import assert_all_ranks_passed, run_workers  # noqa: E402

TF_ENV = {"TF_CPP_MIN_LOG_LEVEL": "2", "TF_ENABLE_ONEDNN_OPTS": "0", "COLLECTIVES_STALL_SHUTDOWN_TIME_SECONDS": "30"}
FAMILIES = ["names", "rsgrad", "uint16", "slices", "errors", "iterations", "local", "dropin"]


# Three ranks only (two ran too until CI neared its 25 minutes): an odd size, with a non-root
# rank in the middle; no family behaves differently at two (the engine's two-rank paths have
# their own tests: test_ops.py, test_fast_path.py, test_shm_allreduce.py).
@pytest.mark.parametrize("np_", [3])
def test_tensorflow_conformance(np_):
    run = run_workers(np_, "tf_conformance_worker.py", *FAMILIES, timeout=240, env=TF_ENV)
    assert_all_ranks_passed(run, np_, min_cases=33)
