"""Never wait forever on another rank's mistake: bad input on one rank, and grouped ops whose
member count differs across ranks, fail on every rank within seconds (each good rank names
the bad rank and its reason); typed errors for bad argument types and values."""
import pytest

from mpi_launch import assert_all_ranks_passed, run_workers

# The cases must finish long before this even on a loaded machine; each case's own deadline
# (10 s) is what shows a hang.
TIMEOUT = 180


@pytest.mark.parametrize("np_", [2, 3])
def test_bad_input_on_one_rank_fails_every_rank(np_):
    run = run_workers(np_, "shared_failure_worker.py", "one_rank", timeout=TIMEOUT)
    assert_all_ranks_passed(run, np_, min_cases=12)


@pytest.mark.parametrize("np_", [2, 3])
def test_group_size_mismatch_fails_every_rank(np_):
    run = run_workers(np_, "shared_failure_worker.py", "groups", timeout=TIMEOUT)
    assert_all_ranks_passed(run, np_, min_cases=7)


def test_argument_types_and_values():
    run = run_workers(2, "shared_failure_worker.py", "arguments", timeout=TIMEOUT)
    assert_all_ranks_passed(run, 2, min_cases=18)


@pytest.mark.parametrize("np_", [2, 3])
def test_torch_inputs_that_differ_on_one_rank(np_):
    run = run_workers(np_, "shared_failure_worker.py", "torch_inputs", timeout=TIMEOUT)
    assert_all_ranks_passed(run, np_, min_cases=5)
