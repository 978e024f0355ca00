"""Smoke test of the bandwidth plot (issue 14, item 7): benchmarks/plot_bandwidth.py's measuring
ranks run on 2 real ranks for two tiny sizes (each path's sum is checked against rank + 1
inputs inside the worker, which exits non-zero on a wrong result), and the driver's plot
function turns their numbers into a PNG. Speed is never asserted here (issue 14: speed is
checked in benchmarks). Skipped without matplotlib (scripts/setup_env.sh bench installs it)."""
import importlib.util
import json
import os
import sys

import pytest

from mpi_launch import run_workers

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))

pytestmark = pytest.mark.skipif(importlib.util.find_spec("matplotlib") is None,
                                reason="matplotlib is not installed (scripts/setup_env.sh bench)")

SIZES = [8, 4096]


def test_plot_bandwidth_measures_and_writes_png(tmp_path):
    import plot_bandwidth

    result_path = tmp_path / "round.json"
    run_workers(2, "plot_bandwidth_worker.py", "--worker", "--impls", "collectives,mpi4py",
                "--sizes", ",".join(map(str, SIZES)), "--budget", "0.002", "--json", result_path, timeout=90)
    result = json.loads(result_path.read_text())
    assert result["failures"] == [] and result["np"] == 2 and result["sizes"] == SIZES
    assert set(result["times"]) == {"collectives", "mpi4py"}
    for name, per_size in result["times"].items():
        assert len(per_size) == len(SIZES) and all(t > 0 for t in per_size), (name, per_size)

    png = tmp_path / "bandwidth.png"
    plot_bandwidth.plot(str(png), SIZES, result["times"], 2, 1, (0.0, 0.0, 0.0), (0.0, 0.0, 0.0), "test")
    data = png.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    assert len(data) < 150 * 1024


def test_size_ladder_spans_the_range_in_steps_of_four():
    import plot_bandwidth

    assert plot_bandwidth.size_ladder(8, 256 * 1024 * 1024)[:3] == [8, 32, 128]
    assert plot_bandwidth.size_ladder(8, 256 * 1024 * 1024)[-2:] == [128 * 1024 * 1024, 256 * 1024 * 1024]
    assert plot_bandwidth.parse_bytes("256MiB") == 256 * 1024 * 1024 and plot_bandwidth.parse_bytes("8B") == 8
