"""join() and process sets on real ranks (tests/engine/workers/join_worker.py and
process_set_worker.py; see their docstrings). A stall shutdown time makes a protocol bug
fail fast with the stalled tensor's name instead of waiting for the launch timeout."""
import pytest

from mpi_launch import assert_all_ranks_passed, run_workers

TIMEOUT = 120
FAIL_FAST = {"COLLECTIVES_STALL_SHUTDOWN_TIME_SECONDS": "30"}


@pytest.mark.parametrize("np_", [2, 3, 4])
def test_join(np_):
    run = run_workers(np_, "join_worker.py", timeout=TIMEOUT, env=FAIL_FAST)
    assert_all_ranks_passed(run, np_, min_cases=5)


def test_join_without_cache():
    run = run_workers(3, "join_worker.py", timeout=TIMEOUT, env=dict(FAIL_FAST, COLLECTIVES_CACHE_CAPACITY="0"))
    assert_all_ranks_passed(run, 3, min_cases=5)


@pytest.mark.parametrize("np_", [2, 3, 4])
def test_process_sets(np_):
    run = run_workers(np_, "process_set_worker.py", timeout=TIMEOUT, env=FAIL_FAST)
    assert_all_ranks_passed(run, np_, min_cases=9)


def test_process_sets_small_fusion_tiny_cache():
    env = dict(FAIL_FAST, COLLECTIVES_FUSION_THRESHOLD="64", COLLECTIVES_CACHE_CAPACITY="3")
    run = run_workers(3, "process_set_worker.py", timeout=TIMEOUT, env=env)
    assert_all_ranks_passed(run, 3, min_cases=9)
