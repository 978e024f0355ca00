"""Autotuning (COLLECTIVES_AUTOTUNE, Horovod's HOROVOD_AUTOTUNE; csrc/monitor/autotune.h).

Under mpirun -np 2, tests/engine/workers/autotune_worker.py runs a loop of mixed allreduces (several
dtypes and sizes, fused and not, a group) and allgathers, checking every result against numpy
on every step while the engine tries parameters, until tuning is over: every rank ends with the
same parameters, the parameters did change during the loop, and rank 0 alone wrote the CSV log
(Horovod's columns, one row per scored sample, then the best). A knob given explicitly (here
Horovod's HOROVOD_CYCLE_TIME) stays as given while the others are tuned. On two simulated hosts
(tests/support/simhosts.py, root only) the hierarchical allreduce and allgather are part of the search.
The knobs' parsing and collectivesrun's flags are checked without MPI.
"""
import csv
import json
import os
import re
import sys

import pytest

import simhosts
from collectives import InvalidArgumentError, config
from collectives.launcher import args as launcher_args
from collectives.launcher import environment
from mpi_launch import assert_all_ranks_passed, run_workers, worker_path

COLUMNS = ["hierarchical_allreduce", "hierarchical_allgather", "torus_allreduce", "cache_enabled", "cycle_time_ms",
           "tensor_fusion_threshold", "score"]
QUICK = {"COLLECTIVES_AUTOTUNE": "1", "COLLECTIVES_AUTOTUNE_WARMUP_SAMPLES": "1",
         "COLLECTIVES_AUTOTUNE_STEPS_PER_SAMPLE": "2"}
MIB = 1 << 20
PARAMS = ("fusion_threshold", "cycle_time_ms", "hierarchical_allreduce", "hierarchical_allgather")


def test_knobs_defaults_horovod_names_and_validation():
    values = config.load({})
    assert (values["autotune"], values["autotune_log"], values["autotune_warmup_samples"],
            values["autotune_steps_per_sample"], values["autotune_bayes_opt_max_samples"],
            values["autotune_gaussian_process_noise"]) == (False, "", 3, 10, 20, 0.8)  # Horovod's defaults
    env = {"HOROVOD_AUTOTUNE": "1", "HOROVOD_AUTOTUNE_LOG": "/tmp/h.csv", "HOROVOD_AUTOTUNE_WARMUP_SAMPLES": "0",
           "HOROVOD_AUTOTUNE_STEPS_PER_SAMPLE": "4", "HOROVOD_AUTOTUNE_BAYES_OPT_MAX_SAMPLES": "7",
           "HOROVOD_AUTOTUNE_GAUSSIAN_PROCESS_NOISE": "0.5", "COLLECTIVES_AUTOTUNE_STEPS_PER_SAMPLE": "6"}
    values = config.load(env)
    assert (values["autotune"], values["autotune_log"], values["autotune_warmup_samples"],
            values["autotune_steps_per_sample"], values["autotune_bayes_opt_max_samples"],
            values["autotune_gaussian_process_noise"]) == (True, "/tmp/h.csv", 0, 6, 7, 0.5)
    for var, text in (("COLLECTIVES_AUTOTUNE", "maybe"), ("HOROVOD_AUTOTUNE_STEPS_PER_SAMPLE", "0"),
                      ("COLLECTIVES_AUTOTUNE_WARMUP_SAMPLES", "-1"), ("COLLECTIVES_AUTOTUNE_BAYES_OPT_MAX_SAMPLES", "x"),
                      ("HOROVOD_AUTOTUNE_GAUSSIAN_PROCESS_NOISE", "-0.1")):
        with pytest.raises(InvalidArgumentError, match=var):
            config.load({var: text})


def test_explicit_knobs_are_passed_as_fixed():
    env = {"HOROVOD_CYCLE_TIME": "3", "COLLECTIVES_HIERARCHICAL_ALLGATHER": "0", "COLLECTIVES_FUSION_THRESHOLD": ""}
    engine = config.engine_config(config.load(env), env)
    assert engine["autotune_fixed"] == ["cycle_time_ms", "hierarchical_allgather"]  # "" is unset
    assert engine["autotune"] is False and engine["autotune_steps_per_sample"] == 10
    assert config.engine_config(config.load({}), {})["autotune_fixed"] == []


def test_collectivesrun_flags():
    args = launcher_args.parse(["-np", "2", "--autotune", "--autotune-log-file", "/tmp/t.csv",
                                "--autotune-warmup-samples", "1", "--autotune-steps-per-sample", "5",
                                "--autotune-bayes-opt-max-samples", "9", "--autotune-gaussian-process-noise", "0.3",
                                "python", "x.py"])
    assert environment.knob_variables(args) == {
        "COLLECTIVES_AUTOTUNE": "1", "COLLECTIVES_AUTOTUNE_LOG": "/tmp/t.csv",
        "COLLECTIVES_AUTOTUNE_WARMUP_SAMPLES": "1", "COLLECTIVES_AUTOTUNE_STEPS_PER_SAMPLE": "5",
        "COLLECTIVES_AUTOTUNE_BAYES_OPT_MAX_SAMPLES": "9", "COLLECTIVES_AUTOTUNE_GAUSSIAN_PROCESS_NOISE": "0.3"}
    assert environment.knob_variables(launcher_args.parse(["-np", "2", "python", "x.py"])) == {}
    with pytest.raises(environment.RankEnvironmentError, match="STEPS_PER_SAMPLE"):
        environment.knob_variables(launcher_args.parse(["-np", "2", "--autotune-steps-per-sample", "0", "python", "x.py"]))


def outcome(run, np_):
    """Final parameters and the parameter sets seen, per rank."""
    final = {int(r): json.loads(j) for r, j in re.findall(r"^params (\d+) (.+)$", run.stdout, re.M)}
    seen = {int(r): json.loads(j) for r, j in re.findall(r"^seen (\d+) (.+)$", run.stdout, re.M)}
    assert sorted(final) == sorted(seen) == list(range(np_)), run.describe()
    return final, seen


def read_log(base, np_, final):
    """Rank 0's CSV rows; no other rank wrote one."""
    for r in range(1, np_):
        assert not os.path.exists(f"{base}.rank{r}"), f"rank {r} wrote an autotune log"
    with open(f"{base}.rank0", newline="") as f:
        rows = list(csv.reader(f))
    assert rows[0] == COLUMNS
    body = [[float(x) for x in row] for row in rows[1:]]
    assert all(len(row) == len(COLUMNS) for row in body)
    assert len(body) == final["samples"] + 1, (final, rows)  # one per scored sample, then the best
    best = body[-1]
    assert best[4] == pytest.approx(final["cycle_time_ms"])
    assert best[5] * MIB == pytest.approx(final["fusion_threshold"])
    assert (best[0], best[1]) == (float(final["hierarchical_allreduce"]), float(final["hierarchical_allgather"]))
    assert all(row[-1] > 0 for row in body)
    return body[:-1]


def test_tuning_keeps_results_right_and_ends_alike_everywhere(tmp_path):
    base = str(tmp_path / "autotune.csv")
    run = run_workers(2, "autotune_worker.py", base, 400, env=QUICK, timeout=180)
    assert_all_ranks_passed(run, 2, min_cases=500)
    final, seen = outcome(run, 2)
    assert all(final[r]["tuning"] is False and final[r]["enabled"] for r in final)
    assert {json.dumps({k: final[r][k] for k in PARAMS}) for r in final} == \
        {json.dumps({k: final[0][k] for k in PARAMS})}, final
    for r in seen:  # the results above were checked while the parameters changed
        assert len(seen[r]) >= 5, seen[r]
    samples = read_log(base, 2, final[0])
    assert len({row[5] for row in samples}) >= 5  # fusion thresholds tried
    assert len({row[4] for row in samples}) >= 4  # cycle times tried
    assert not any(row[0] or row[1] for row in samples)  # one host: hierarchical is not an option
    assert samples[0][4:6] == [1.0, 128.0]  # the defaults are scored first


def test_explicit_knob_stays_fixed(tmp_path):
    base = str(tmp_path / "fixed.csv")
    env = dict(QUICK, HOROVOD_CYCLE_TIME="3", COLLECTIVES_AUTOTUNE_BAYES_OPT_MAX_SAMPLES="3")
    run = run_workers(2, "autotune_worker.py", base, 300, env=env, timeout=180)
    assert_all_ranks_passed(run, 2, min_cases=100)
    final, seen = outcome(run, 2)
    assert all(final[r]["cycle_time_ms"] == 3.0 for r in final), final
    assert all(s["cycle_time_ms"] == 3.0 for r in seen for s in seen[r]), seen
    samples = read_log(base, 2, final[0])
    assert 3 <= len(samples) <= 5  # the cap, plus the rematch's two
    assert all(row[4] == 3.0 for row in samples)
    assert len({row[5] for row in samples}) >= 3  # the fusion threshold was tuned


REASON = simhosts.unavailable_reason()


@pytest.mark.skipif(REASON is not None, reason=f"needs simulated hosts: {REASON}")
def test_two_hosts_tune_the_hierarchical_choice(tmp_path):
    base = str(tmp_path / "hosts.csv")
    py = sys.executable
    flags = ["--autotune", "--autotune-warmup-samples", "1", "--autotune-steps-per-sample", "2", "--log-level", "info"]
    with simhosts.SimHosts(["hosta", "hostb"]) as sim:
        run = sim.run("hosta", [py, "-m", "collectives.run", "-np", 4, "-H", "hosta:2,hostb:2", *flags, py,
                                worker_path("autotune_worker.py"), base, 400], timeout=240)
        left = {h: p for h, p in sim.processes().items() if p}
        sim.kill_everything()
    assert run.returncode == 0, run.describe()
    assert not left, f"processes left on the hosts: {left}"
    assert_all_ranks_passed(run, 4, min_cases=500)
    final, _ = outcome(run, 4)
    assert len({json.dumps({k: final[r][k] for k in PARAMS}) for r in final}) == 1, final
    samples = read_log(base, 4, final[0])
    print("autotune samples on 2 hosts:", samples, "final:", final[0])
    assert any(row[0] == 1.0 for row in samples), samples  # hierarchical allreduce tried
    assert any(row[1] == 1.0 for row in samples), samples  # hierarchical allgather tried
