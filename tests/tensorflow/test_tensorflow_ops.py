"""collectives.tensorflow (the horovod.tensorflow face) against numpy references on 3 real MPI ranks.

Each launch runs ``tests/tensorflow/workers/tf_ops_worker.py`` with every family: allreduce (every TF
dtype x Sum/Average/Min/Max/Product, scaled, deprecated ``average``, compression,
tf.IndexedSlices), grouped allreduce, broadcast and broadcast_variables, allgather (uneven
first dimensions, 0-d), alltoall (random splits, equal parts), reducescatter (uneven),
gradients of every differentiable op in the four float dtypes, and misc (zero-copy and
alignment, names inside tf.function, XLA error, mismatch errors, join, barrier, process
sets, and that importing collectives imports no framework while the faces carry Horovod's
names) -- each case eagerly and inside tf.function.
"""
import pytest

pytest.importorskip("tensorflow")

from mpi_launch import assert_all_ranks_passed, run_workers  # noqa: E402

TF_ENV = {"TF_CPP_MIN_LOG_LEVEL": "2", "TF_ENABLE_ONEDNN_OPTS": "0"}
FAMILIES = ["allreduce", "grouped", "broadcast", "allgather", "alltoall", "reducescatter", "gradients", "misc"]


# Three ranks only: an odd count exercises uneven splits and reductions that two would not, the
# engine's algorithms are covered at 2, 3 and 4 ranks by tests/engine/test_ops.py, and a second launch
# of this worker cost 19 s of CI's 25 minutes.
def test_tensorflow_ops():
    run = run_workers(3, "tf_ops_worker.py", *FAMILIES, timeout=240, env=TF_ENV)
    assert_all_ranks_passed(run, 3, min_cases=141)

