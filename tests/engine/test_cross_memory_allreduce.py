"""The cross-memory allreduce (csrc/algorithms/cross_memory_allreduce.h, COLLECTIVES_CMA_ALLREDUCE): when
every rank runs on one host, host allreduces above 512 KiB are computed in chunks that any rank
takes, reading its peers' inputs and writing into their outputs with process_vm_readv/writev.

tests/engine/workers/cma_worker.py runs on 2 ranks (a chunk's peer is read into the output, or into a
scratch buffer in place) and on 3 (inputs folded in rank order), with the path on (the default)
and off: every dtype in and out of place, every op, partial last chunks, random floats, a fused
group, 40 allreduces back to back and a joined rank, each against a numpy reference on every rank.
Every rank must receive the same bits, and the integer-valued results (exact in every order) the
same bits as MPI's. The engine's log says which path ran, and no segment is left in /dev/shm.
"""
import glob
import re

import pytest

from collectives import config
from mpi_launch import assert_all_ranks_passed, run_workers


def shm_files():
    return set(glob.glob("/dev/shm/collectives-*"))


def digests(run):
    """{label: {rank: sha1}} from the worker's "digest RANK LABEL SHA1" lines."""
    found = {}
    # Not anchored: lines of several ranks can run together in mpirun's stream.
    for rank, label, sha in re.findall(r"digest (\d+) ([^\n]+?) ([0-9a-f]{40})", run.stdout):
        found.setdefault(label, {})[int(rank)] = sha
    return found


@pytest.mark.parametrize("np_", [2, 3])
def test_results_match_numpy_on_every_rank_and_the_mpi_path(np_):
    before = shm_files()
    on = run_workers(np_, "cma_worker.py", env={"COLLECTIVES_LOG_LEVEL": "info"}, timeout=300)
    assert_all_ranks_passed(on, np_, min_cases=90)
    assert on.stderr.count(f"cross-memory allreduce on {np_} ranks") == np_, on.describe()
    off = run_workers(np_, "cma_worker.py", env={"COLLECTIVES_LOG_LEVEL": "info", "COLLECTIVES_CMA_ALLREDUCE": "0"},
                      timeout=300)
    assert_all_ranks_passed(off, np_, min_cases=90)
    assert "cross-memory allreduce on" not in off.stderr, off.describe()

    ours, mpi = digests(on), digests(off)
    assert len(ours) >= 80 and ours.keys() == mpi.keys(), sorted(set(ours) ^ set(mpi))[:5]
    # Every rank that reduced received the same bits (the joined rank has no result).
    split = {label: shas for label, shas in ours.items() if len(set(shas.values())) != 1}
    assert not split, f"ranks received different results: {list(split)[:5]}"
    assert all(len(shas) == np_ for shas in ours.values()), "a rank did not print its digests"
    # Integer-valued inputs are exact in any order; with two ranks every op is a single
    # commutative step, so even the random floats must equal MPI's.
    compared = [label for label in ours if np_ == 2 or not label.startswith("random")]
    differ = [label for label in compared if ours[label][0] != mpi[label][0]]
    assert not differ, f"results differ from the MPI path's: {differ[:5]}"
    assert shm_files() <= before, f"segments left behind: {shm_files() - before}"


def test_knob_parses_and_reaches_the_engine():
    assert config.read("cma_allreduce", {}) is True
    assert config.read("cma_allreduce", {"COLLECTIVES_CMA_ALLREDUCE": "off"}) is False
    assert config.engine_config(config.load({"COLLECTIVES_CMA_ALLREDUCE": "0"}))["cma_allreduce"] is False


def test_non_boolean_value_stops_init_on_every_rank():
    variable = "COLLECTIVES_CMA_ALLREDUCE"
    run = run_workers(2, "config_worker.py", variable, env={variable: "maybe"}, timeout=120)
    assert_all_ranks_passed(run, 2, min_cases=2)  # each rank: the typed error, then a good init
