"""collectives.torch.SyncBatchNorm on real ranks: one mpirun launch of
``tests/torch/workers/torch_sync_bn_worker.py`` at 3 ranks (see its docstring): outputs, running statistics
and gradients against torch.nn.BatchNorm{1,2,3}d on the whole batch, with uneven and empty
shares, eval mode, momentum=None, affine=False, half precisions, DistributedOptimizer
training equivalence, convert_sync_batchnorm, and errors raised alike on every rank."""
import pytest

from mpi_launch import assert_all_ranks_passed, run_workers

pytest.importorskip("torch")

TIMEOUT = 120  # seconds per launch; np=2 takes ~5 s and np=3 ~8 s on an idle 2-core machine


# Three ranks only: uneven (and empty) shares of the batch need an odd count, and the statistics'
# allgather and allreduce do not depend on it otherwise; a launch at 2 ranks cost CI 7 s.
def test_torch_sync_batch_norm():
    run = run_workers(3, "torch_sync_bn_worker.py", "shapes", "options", "training", "errors", timeout=TIMEOUT)
    assert_all_ranks_passed(run, 3, min_cases=22)
