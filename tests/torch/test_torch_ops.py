"""collectives.torch (the horovod.torch face) against numpy references on 2 and 3 real MPI ranks.

Each launch runs ``tests/torch/workers/torch_ops_worker.py`` with every family: allreduce (every
torch dtype x Sum/Average/Min/Max/Product, in place contiguous and not, async), scaled and
deprecated-``average`` allreduces, grouped allreduce (all four variants), broadcast,
allgather (uneven first dimensions), alltoall (random splits, received splits as int32,
equal parts), reducescatter (uneven), backward of every differentiable op in float32 and
float64 (named and automatically named), compression, zero-copy, 0-d, errors, objects.
"""
import os
import subprocess
import sys

import pytest

pytest.importorskip("torch")

from mpi_launch import assert_all_ranks_passed, run_workers  # noqa: E402

FAMILIES = ["allreduce", "grouped", "broadcast", "allgather", "alltoall", "reducescatter", "backward", "misc"]


@pytest.mark.parametrize("np_", [2, 3])
def test_torch_ops(np_):
    run = run_workers(np_, "torch_ops_worker.py", *FAMILIES, timeout=240)
    assert_all_ranks_passed(run, np_, min_cases=101)


def test_import_collectives_does_not_import_torch():
    code = ("import sys, collectives; assert 'torch' not in sys.modules; "
            "import collectives.torch as hvd; assert 'torch' in sys.modules; "
            "assert issubclass(hvd.HorovodInternalError, RuntimeError); "
            "names = '''init shutdown is_initialized size rank local_size local_rank cross_size cross_rank mpi_built "
            "mpi_enabled mpi_threads_supported nccl_built gloo_built cuda_built Average Sum Min Max Product Adasum "
            "allreduce allreduce_ allreduce_async allreduce_async_ grouped_allreduce grouped_allreduce_ "
            "grouped_allreduce_async grouped_allreduce_async_ allgather allgather_async grouped_allgather broadcast "
            "broadcast_ broadcast_async broadcast_async_ alltoall reducescatter grouped_reducescatter poll "
            "synchronize barrier broadcast_object allgather_object Compression HorovodInternalError'''.split(); "
            "missing = [n for n in names if not hasattr(hvd, n)]; assert not missing, missing")
    env = dict(os.environ, OMP_NUM_THREADS="1")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 0, proc.stderr
