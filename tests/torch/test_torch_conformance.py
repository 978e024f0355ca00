"""Horovod behaviours of collectives.torch (issue 11) on 2 and 3 real MPI ranks.

One launch per rank count runs ``tests/torch/workers/torch_conformance_worker.py`` with every
family (see its docstring): ccl_built/ddl_built, Horovod's reducescatter gradient,
broadcast_optimizer_state on fresh optimizers and with ``model=``, DistributedOptimizer
``num_groups``, sparse_allreduce_async and sparse gradients in DistributedOptimizer, and
process sets built from per-rank mpi4py communicators -- values against numpy references,
errors on every rank.
"""
import pytest

from mpi_launch import assert_all_ranks_passed, run_workers

pytest.importorskip("torch")

FAMILIES = ["builds", "rsgrad", "optstate", "sparse", "commsets"]


@pytest.mark.parametrize("np_", [2, 3])
def test_torch_conformance(np_):
    run = run_workers(np_, "torch_conformance_worker.py", *FAMILIES, timeout=180,
                      env={"COLLECTIVES_STALL_SHUTDOWN_TIME_SECONDS": "30"})
    assert_all_ranks_passed(run, np_, min_cases=17)
