"""stop_timeline() returns only once the file is complete JSON: after a child forked while the
timeline ran has exited normally, and when two threads stop it at once; on two ranks, rank 0
writing (tests/engine/workers/timeline_race_worker.py)."""
from mpi_launch import assert_all_ranks_passed, run_workers


def test_stop_timeline_returns_a_complete_file(tmp_path):
    run = run_workers(2, "timeline_race_worker.py", str(tmp_path), timeout=120)
    assert_all_ranks_passed(run, 2, min_cases=3)
