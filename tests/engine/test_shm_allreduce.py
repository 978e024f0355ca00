"""The shared-memory allreduce (csrc/algorithms/shm_allreduce.h, COLLECTIVES_SHM_ALLREDUCE): when every
rank runs on one host, host allreduces of 8 to 512 KiB go through a shared segment.

tests/engine/workers/hierarchical_worker.py runs on 3 ranks (shares that do not divide evenly) with the
segment on (the default) and off: every dtype x op with prescale/postscale at odd sizes above
8 KiB (the segment), below it and above 512 KiB (MPI in both runs), random floats against a
float64 reference, a joined rank contributing zeros, against numpy references on every rank;
the integer-valued results are bit-identical between the two runs (digests). The engine's log
says which path ran, and no segment is left in /dev/shm. (A mutation that skipped one rank's
share of the reduction made the first test fail: checked by hand on 2026-11-24.)
"""
import glob

from collectives import config
from mpi_launch import assert_all_ranks_passed, assert_same_digests, run_workers

PARTS = ["allreduce", "float", "join"]


def shm_files():
    # Every segment the engine maps (csrc/shm/shared_segment.cc): the allreduce's slots and the
    # host's count of waiting threads.
    return set(glob.glob("/dev/shm/collectives-*"))


def test_results_match_numpy_and_the_mpi_path():
    before = shm_files()
    on = run_workers(3, "hierarchical_worker.py", *PARTS, env={"COLLECTIVES_LOG_LEVEL": "info"}, timeout=300)
    assert_all_ranks_passed(on, 3, min_cases=100)
    assert on.stderr.count("shared-memory allreduce on 3 ranks") == 3, on.describe()
    off = run_workers(3, "hierarchical_worker.py", *PARTS,
                      env={"COLLECTIVES_LOG_LEVEL": "info", "COLLECTIVES_SHM_ALLREDUCE": "0"}, timeout=300)
    assert_all_ranks_passed(off, 3, min_cases=100)
    assert "shared-memory allreduce on" not in off.stderr, off.describe()
    assert_same_digests(on, off, "results differ from the MPI path's", minimum=101)
    assert shm_files() <= before, f"segments left behind: {shm_files() - before}"


def test_knob_parses_and_reaches_the_engine():
    assert config.read("shm_allreduce", {}) is True
    assert config.read("shm_allreduce", {"COLLECTIVES_SHM_ALLREDUCE": "off"}) is False
    assert config.engine_config(config.load({"COLLECTIVES_SHM_ALLREDUCE": "0"}))["shm_allreduce"] is False


def test_non_boolean_value_stops_init_on_every_rank():
    variable = "COLLECTIVES_SHM_ALLREDUCE"
    run = run_workers(2, "config_worker.py", variable, env={variable: "maybe"}, timeout=120)
    assert_all_ranks_passed(run, 2, min_cases=2)  # each rank: the typed error, then a good init
