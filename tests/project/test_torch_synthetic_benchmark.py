"""examples/pytorch_synthetic_benchmark.py and benchmarks/torch_training_bench.py at np=2 with
tiny sizes (a resnet10 on a few 32x32 images): they run, and their figures parse and agree
with each other. Throughput itself is not checked (the machine may be busy)."""
import os
import re

import pytest

from mpi_launch import run_workers

pytest.importorskip("torch")

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
EXAMPLE = os.path.join(ROOT, "examples", "pytorch_synthetic_benchmark.py")
BENCH = os.path.join(ROOT, "benchmarks", "torch_training_bench.py")
TINY = ["--model", "resnet10", "--batch-size", "2", "--image-size", "32", "--num-warmup-batches", "1",
        "--num-batches-per-iter", "1"]
TIMEOUT = 90  # seconds per launch; each takes ~5 s on an idle 2-core machine
NUMBER = r"([0-9]+\.[0-9])"


@pytest.mark.parametrize("mode, label", [([], "collectives DistributedOptimizer"),
                                         (["--no-distributed-optimizer"], "no distributed optimizer")])
def test_synthetic_benchmark_example(mode, label):
    run = run_workers(2, EXAMPLE, *TINY, "--num-iters", "3", *mode, timeout=TIMEOUT)
    out = run.stdout
    assert f"Mode: {label}" in out and "Number of ranks: 2" in out, run.describe()
    iters = [float(x) for x in re.findall(rf"^Iter #\d+: {NUMBER} img/sec per rank$", out, re.M)]
    per_rank = re.findall(rf"^Img/sec per rank: {NUMBER} \+-{NUMBER}$", out, re.M)
    total = re.findall(rf"^Total img/sec on 2 ranks: {NUMBER} \+-{NUMBER}$", out, re.M)
    assert len(iters) == 3 and len(per_rank) == 1 and len(total) == 1, run.describe()  # rank 0 prints alone
    (mean, spread), (total_mean, total_spread) = map(float, per_rank[0]), map(float, total[0])
    assert mean > 0 and spread >= 0 and total_spread >= 0, run.describe()
    assert abs(total_mean - 2 * mean) <= 0.15, run.describe()  # the total is the sum over the ranks


def test_training_bench_compares_three_modes():
    run = run_workers(2, BENCH, *TINY, "--num-rounds", "2", timeout=TIMEOUT)
    rows = {}
    for label in ("collectives DistributedOptimizer", "no communication", r"torch DDP \(gloo\)"):
        found = re.findall(rf"^{label} +{NUMBER} +\({NUMBER}-{NUMBER}\) +{NUMBER} +\({NUMBER}-{NUMBER}\) +"
                           rf"{NUMBER} +([0-9]+\.[0-9]+) +([0-9]+\.[0-9]+)$", run.stdout, re.M)
        assert len(found) == 1, f"no row for {label}\n{run.describe()}"
        rows[label] = [float(x) for x in found[0]]
    for label, (median, low, high, total, total_low, total_high, step_ms, vs_none, vs_ddp) in rows.items():
        assert 0 < low <= median <= high and 0 < total_low <= total <= total_high, (label, run.describe())
        assert abs(total - 2 * median) <= 0.15 and step_ms > 0, (label, run.describe())
    assert rows["no communication"][7] == 1.0 and rows[r"torch DDP \(gloo\)"][8] == 1.0, run.describe()
