"""Smoke test of benchmarks/zero_bench.py (a tiny model, 2 ranks, one round): it launches its
workers and prints the memory rows for every zero_stage, a step-time row per variant and the
load. Speed is never asserted here."""
import os
import re
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BENCH = os.path.join(ROOT, "benchmarks", "zero_bench.py")


def test_zero_bench_prints_one_table():
    run = subprocess.run([sys.executable, BENCH, "--params", "20000", "--batch", "4", "--ranks", "2", "--rounds", "1",
                          "--steps", "1", "--timeout", "120"],
                         capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stdout + run.stderr
    rows = {int(m.group(1)): float(m.group(2))
            for m in re.finditer(r"^\| 2 \| (\d) \| ([\d.]+) \|", run.stdout, re.MULTILINE)}
    assert sorted(rows) == [0, 1, 2], run.stdout
    for name in ("ours unsharded", "ours stage 1", "ours stage 2", "DDP + ZeroRedundancyOptimizer",
                 "DeepSpeed ZeRO 1/2"):
        assert f"| {name} |" in run.stdout, run.stdout
    assert "load average" in run.stdout, run.stdout
