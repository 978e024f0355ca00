"""scripts/gpu-check.sh and scripts/gpu_report.py without a GPU: the bench and holds stages launch
scripts/gpu_bench.py through the recorded mpirun (here a stand-in that prints what it was asked
to run and fails where told), report every launch, and the report tabulates the holds stage's
JSON. The GPU machine runs the real thing (docs/gpus.md, "Checking on a GPU machine")."""
import json
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))

FAKE_MPIRUN = """#!/bin/bash
# mpirun -np N PYTHON scripts/gpu_bench.py ARGS: print them and the knobs; fail for one value
n=$2; shift 2
echo "launch np=$n: $* wait_ms=${COLLECTIVES_GPU_FUSION_WAIT_MS:-unset} wait=${COLLECTIVES_GPU_FUSION_WAIT:-unset} shared=${COLLECTIVES_TEST_SHARED_GPU:-unset}"
[ "${COLLECTIVES_GPU_FUSION_WAIT_MS:-}" = "$FAIL_FOR_MS" ] && exit 3
exit 0
"""


def sources_digest():
    # What gpu-check.sh's setup compares to skip a setup already done (every file under csrc/, then setup.py).
    out = subprocess.run("(find csrc -type f | LC_ALL=C sort | xargs cat; cat setup.py) 2>/dev/null | md5sum | cut -c1-16",
                         shell=True, cwd=REPO,
                         capture_output=True, text=True, check=True)
    return out.stdout.strip()


def test_bench_and_holds_launch_and_report_each_run(tmp_path):
    repo = tmp_path / "repo"
    # A copy of what the script reads: itself, the report writer, and the sources it digests.
    os.makedirs(repo)
    subprocess.run(["cp", "-r", os.path.join(REPO, "scripts"), os.path.join(REPO, "csrc"),
                    os.path.join(REPO, "setup.py"), str(repo)], check=True)
    mpirun = tmp_path / "mpirun"
    mpirun.write_text(FAKE_MPIRUN)
    mpirun.chmod(0o755)
    state = repo / "build" / "gpu-check"
    state.mkdir(parents=True)
    # A setup done on this "machine": one GPU shared by two ranks.
    (state / "state").write_text(f"setup=ok\nsources={sources_digest()}\npython={sys.executable}\n"
                                 f"mpirun={mpirun}\ngpus=1\nnp=2\nshared=1\n")
    report = tmp_path / "report"
    env = dict(os.environ, GPU_CHECK_HOLDS="20 100 20", GPU_CHECK_BUDGET_S="400", FAIL_FOR_MS="100")
    env.pop("OUT", None)
    run = subprocess.run(["bash", "scripts/gpu-check.sh", "--report", str(report), "holds", "bench"], cwd=repo,
                         env=env, capture_output=True, text=True, timeout=120)
    log = (state / "bench.log").read_text()
    text = (report / "gpu-check-report.md").read_text()
    assert run.returncode == 1, run.stdout + run.stderr  # the launch told to fail is a FAILED line
    # Every launch in one log, with its knobs; a repeated value gets a JSON file of its own.
    launches = [line for line in log.splitlines() if line.startswith("launch")]
    assert len(launches) == 6, log
    assert "--sections fused,train" in launches[0] and "bench-hold-1-20.json" in launches[0], log
    assert "wait_ms=100" in launches[1] and "bench-hold-2-100.json" in launches[1], log
    assert "bench-hold-3-20.json" in launches[2], log
    assert all("shared=1" in line for line in launches), log
    assert "launch np=2:" in launches[3] and "bench-np2.json" in launches[3], log
    assert "launch np=1:" in launches[4] and "bench-np1.json" in launches[4], log
    assert "wait=0" in launches[5] and "--sections fused" in launches[5], log
    for line in ("- np=2, wait at most 20 ms: ok", "- np=2, wait at most 100 ms: FAILED (rc 3, bench.log)",
                 "- np=2: ok", "- np=1: ok", "- np=2 without the fusion wait: ok"):
        assert line in text, text


def test_report_tabulates_the_holds_runs(tmp_path):
    state, report = tmp_path / "state", tmp_path / "report"
    state.mkdir()
    (state / "state").write_text("started=2026-11-28T17:21:07Z\n")
    (state / "part-holds.md").write_text("- np=2, wait at most 100 ms: ok [21 s]\n")
    base = {"ranks": 2, "fused_161_s": 0.0676, "fused_161_launches": 2.9, "train_ours_rounds_s": [0.0814, 0.0810],
            "train_ddp_rounds_s": [0.0869, 0.0878], "train_ours_s": 0.0810, "train_ddp_s": 0.0869,
            "train_ours_launches_per_step": [6.9, 3.8]}
    # Launch 10 sorts after launch 2: by launch number, not by name.
    for n, ms, fused in ((2, "100", 0.0676), (10, "100", 0.0700), (1, "1", 0.0925)):
        (state / f"bench-hold-{n}-{ms}.json").write_text(json.dumps(dict(base, gpu_fusion_wait_ms=ms, fused_161_s=fused)))
    subprocess.run([sys.executable, os.path.join(REPO, "scripts", "gpu_report.py"), str(state), str(report)],
                   check=True, capture_output=True, timeout=60)
    text = (report / "gpu-check-report.md").read_text()
    rows = [line for line in text.splitlines() if line.startswith("| 1 ") or line.startswith("| 100 ")]
    assert [r.split("|")[2].strip() for r in rows] == ["92.5", "67.6", "70.0"], text
    assert "| 81.4/81.0 | 86.9/87.8 | 0.93x | 6.9/3.8 |" in rows[1], text
    collected = json.loads((report / "bench-holds.json").read_text())
    assert set(collected) == {"bench-hold-2-100.json", "bench-hold-10-100.json", "bench-hold-1-1.json"}
