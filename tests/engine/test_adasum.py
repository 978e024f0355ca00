"""op=Adasum (Horovod's adaptive summation) on real ranks under mpirun.

Each test is one launch; the workers compare every result with the numpy reference of
tests/engine/workers/adasum_reference.py computed from each rank's inputs:

- ``adasum_worker.py numpy torch optim`` at 4 ranks: the allreduce verbs for float16,
  float32 and float64 (single tensors, a fused group whose tensors must each be combined on
  their own, scale factors, zeros, a joined rank), the torch verbs and gradient, the torch
  delta optimizer (SGD with momentum, Adam, backward_passes_per_step=2) against a numpy
  re-implementation, and the refusals (int32/bfloat16, reducescatter, process sets) on every
  rank that makes the call;
- ``adasum_worker.py refused`` at 3 ranks: every verb and the optimizer raise
  NotImplementedError (collectives' NotSupportedError) on every rank;
- ``adasum_tf_worker.py`` at 2 ranks (the engine's algorithm at 4 is covered above): the TensorFlow verbs eagerly and in tf.function,
  DistributedGradientTape(op=Adasum) training, and Horovod's refusals (Keras optimizers,
  sparse gradients).
"""
import pytest

from mpi_launch import assert_all_ranks_passed, run_workers

TIMEOUT = 240  # seconds per launch; each takes 3-15 s on an idle 2-core machine
ENV = {"COLLECTIVES_STALL_SHUTDOWN_TIME_SECONDS": "60"}  # a hang fails the launch, not the suite


# Four ranks: the recursive algorithm's first level is the 2-rank case (which the TensorFlow
# launch below also runs), the second combines pairs; a launch at 2 ranks cost CI 7 s.
@pytest.mark.parametrize("np_", [4])
def test_adasum_numpy_and_torch(np_):
    pytest.importorskip("torch")
    run = run_workers(np_, "adasum_worker.py", "numpy", "torch", "optim", timeout=TIMEOUT, env=ENV)
    assert_all_ranks_passed(run, np_, min_cases=13)


def test_adasum_refused_on_three_ranks():
    pytest.importorskip("torch")
    run = run_workers(3, "adasum_worker.py", "refused", timeout=TIMEOUT, env=ENV)
    assert_all_ranks_passed(run, 3, min_cases=1)


@pytest.mark.parametrize("np_", [2])
def test_adasum_tensorflow(np_):
    pytest.importorskip("tensorflow")
    pytest.importorskip("keras")
    run = run_workers(np_, "adasum_tf_worker.py", timeout=TIMEOUT, env=ENV)
    assert_all_ranks_passed(run, np_, min_cases=5)
