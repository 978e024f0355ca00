"""Runs benchmarks/plot_bandwidth.py's measuring ranks (its --worker mode) for
tests/project/test_benchmark_plots.py, so the launch goes through run_workers like every other test."""
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))

import plot_bandwidth  # noqa: E402

if __name__ == "__main__":
    sys.exit(plot_bandwidth.main(sys.argv[1:]))
