"""collectives.torch.SyncBatchNorm on real ranks: one mpirun launch per rank count of
``tests/workers/torch_sync_bn_worker.py`` (see its docstring): outputs, running statistics
and gradients against torch.nn.BatchNorm{1,2,3}d on the whole batch, with uneven and empty
shares, eval mode, momentum=None, affine=False, half precisions, DistributedOptimizer
training equivalence, convert_sync_batchnorm, and errors raised alike on every rank."""
import pytest

from mpi_launch import assert_all_ranks_passed, run_workers

pytest.importorskip("torch")

TIMEOUT = 120  # seconds per launch; np=2 takes ~5 s and np=3 ~8 s on an idle 2-core machine


@pytest.mark.parametrize("np_", [2, 3])
def test_torch_sync_batch_norm(np_):
    run = run_workers(np_, "torch_sync_bn_worker.py", "shapes", "options", "training", "errors", timeout=TIMEOUT)
    assert_all_ranks_passed(run, np_, min_cases=22)
