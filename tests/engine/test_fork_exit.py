"""A child forked after init() that ends through Python's normal exit (sys.exit, an uncaught
exception), on both ranks: it exits at once with its status, and the parent's allreduce goes on
(tests/engine/workers/fork_exit_worker.py). The child used to hang at exit for ever when another
thread of the parent was waiting for the GIL at the fork (csrc/python/python_gil.h)."""
from mpi_launch import assert_all_ranks_passed, run_workers


def test_forked_child_exits_normally_at_once():
    run = run_workers(2, "fork_exit_worker.py", timeout=120)
    assert_all_ranks_passed(run, 2, min_cases=4)
