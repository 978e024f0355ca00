"""Smoke test of benchmarks/grouped_bench.py on 2 real ranks: it checks every variant's result
against numpy's average of every rank's inputs before timing (exiting non-zero on a wrong one)
and prints a row per variant. Speed is never asserted here (issue 14)."""
import os

from mpi_launch import run_workers

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BENCH = os.path.join(ROOT, "benchmarks", "grouped_bench.py")


def test_grouped_bench_checks_its_results_and_reports_every_variant():
    run = run_workers(2, BENCH, "--model", "cnn", "--rounds", "1", "--calls", "2", timeout=90)
    rows = [line.split()[0] for line in run.stdout.splitlines() if "us per call" in line]
    assert rows == ["sync", "async", "raw", "raw_flat"], run.describe()
    assert "6 arrays, 139304 bytes; 2 ranks" in run.stdout, run.describe()
