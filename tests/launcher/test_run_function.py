"""``collectives.run(func, np=N)`` (Horovod's ``horovod.run``): each rank's return value in
rank order, arguments and closures carried over, an exception raised in the caller with its
rank named. Real ranks under the real launcher; each call has a hard timeout."""
import numpy as np
import pytest

import collectives

TIMEOUT = 120


def _allreduce_on_every_rank(scale, offset=0.0):
    import numpy as np

    import collectives as hvd

    hvd.init()
    x = np.arange(4, dtype=np.float64) * (hvd.rank() + 1) * scale + offset
    total = hvd.allreduce(x, op=hvd.Sum)
    result = (hvd.rank(), hvd.size(), total)
    hvd.shutdown()
    return result


@pytest.mark.parametrize("np_", [2, 3])
def test_returns_each_ranks_value_in_rank_order(np_):
    results = collectives.run(_allreduce_on_every_rank, args=(2.0,), kwargs={"offset": 1.0}, np=np_, timeout=TIMEOUT)
    assert [r for r, _, _ in results] == list(range(np_))
    expected = sum(np.arange(4, dtype=np.float64) * (r + 1) * 2.0 + 1.0 for r in range(np_))
    for rank, size, total in results:
        assert size == np_
        np.testing.assert_array_equal(total, expected)


def test_closure_over_local_state():
    factor = 7

    def fn():
        import collectives as hvd

        hvd.init()
        out = hvd.allgather_object(hvd.rank() * factor)
        hvd.shutdown()
        return out

    assert collectives.run(fn, np=2, timeout=TIMEOUT) == [[0, 7], [0, 7]]


def test_without_hosts_it_stays_on_this_machine_inside_a_slurm_allocation():
    import os

    # Nodes that do not exist: through the allocation the job could not start.
    env = dict(os.environ, SLURM_JOB_ID="1", SLURM_JOB_NODELIST="nowhere[1-2]", SLURM_TASKS_PER_NODE="1(x2)")
    results = collectives.run(_allreduce_on_every_rank, args=(1.0,), np=2, env=env, timeout=TIMEOUT)
    assert [(r, size) for r, size, _ in results] == [(0, 2), (1, 2)]


def _fails_on_rank_one():
    import collectives as hvd

    hvd.init()
    if hvd.rank() == 1:
        raise KeyError("rank one has no data")
    hvd.barrier()  # rank 0 waits here; it must not keep the caller waiting
    return "unreachable"


def test_exception_on_a_rank_is_raised_with_the_rank_named():
    with pytest.raises(KeyError, match="rank one has no data") as info:
        collectives.run(_fails_on_rank_one, np=2, timeout=TIMEOUT)
    notes = "\n".join(getattr(info.value, "__notes__", []))
    assert "rank 1" in notes and "_fails_on_rank_one" in notes


def test_module_stays_the_command_line():
    import collectives.run as module  # the CLI module is callable too

    assert callable(module) and callable(module.main)
    assert module(_allreduce_on_every_rank, args=(1.0,), np=1, timeout=TIMEOUT)[0][0] == 0
