"""Callers that run the engine's cycles themselves (csrc/core/engine_inline.cc, COLLECTIVES_CALLER_CYCLES).

tests/engine/workers/caller_cycles_worker.py runs three threads of synchronous verbs and asynchronous
allreduces synchronized out of order on every rank, with ranks arriving in changing order, and
checks every result against numpy, then repeats two cached allreduces on one thread (cycles
that its calls run). It runs on 2 ranks (a core each: waits may spin) and on 3
(more ranks than cores), with callers running cycles (the default) and, on 3 ranks, with the
engine thread alone: the engine's report must show that callers ran cycles in the first runs (on some
rank: whether a caller finds the cycle free is timing) and none in the last, and the results must be bit-identical.
"""
import re

from collectives import config
from mpi_launch import assert_all_ranks_passed, assert_same_digests, run_workers

STAGES = {"COLLECTIVES_LATENCY_STAGES": "1"}


def caller_cycles(run):
    """Per rank, (cycles, cycles run by callers) from the engine's report at shutdown."""
    found = re.findall(r"\[collectives latency stages rank (\d+)\].*cycles (\d+), run by callers (\d+)", run.stderr)
    return {int(r): (int(total), int(by_callers)) for r, total, by_callers in found}


def test_callers_run_cycles_and_results_match_numpy_and_the_engine_thread():
    runs = {}
    for np_, on in ((2, True), (3, True), (3, False)):
        env = dict(STAGES, COLLECTIVES_CALLER_CYCLES="1" if on else "0")
        run = run_workers(np_, "caller_cycles_worker.py", env=env, timeout=240)
        assert_all_ranks_passed(run, np_, min_cases=3 * 40 + 3 * 40 + 2 * 30)
        cycles = caller_cycles(run)
        assert sorted(cycles) == list(range(np_)), run.describe()
        for rank, (total, by_callers) in cycles.items():
            assert 0 <= by_callers <= total, f"rank {rank}: {by_callers} of {total} cycles\n{run.describe()}"
            if not on:
                assert by_callers == 0, f"rank {rank}: {by_callers} cycles run by callers with the knob off"
        if on:
            # Whether a caller finds the cycle free is timing: an engine thread still in an active
            # streak keeps it, and with 3 ranks on 2 cores one rank's callers ran none once in
            # many runs. Some caller on some rank must have run cycles.
            assert sum(by for _, by in cycles.values()) > 0, f"no caller ran a cycle\n{run.describe()}"
        runs[(np_, on)] = run
    assert_same_digests(runs[(3, True)], runs[(3, False)], "callers' cycles changed results", minimum=300)


def test_knob_parses_and_reaches_the_engine():
    assert config.read("caller_cycles", {}) is True
    assert config.read("caller_cycles", {"COLLECTIVES_CALLER_CYCLES": "off"}) is False
    assert config.engine_config(config.load({"COLLECTIVES_CALLER_CYCLES": "0"}))["caller_cycles"] is False
