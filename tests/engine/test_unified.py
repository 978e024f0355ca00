"""The framework-agnostic face: ``collectives.<verb>`` on numpy, torch and TensorFlow tensors
(tests/engine/workers/unified_worker.py, see its docstring), mixed frameworks in one collective, and
an import of ``collectives`` that loads no framework."""
import subprocess
import sys

import pytest

from mpi_launch import assert_all_ranks_passed, run_workers

TIMEOUT = 180
ENV = {"COLLECTIVES_STALL_SHUTDOWN_TIME_SECONDS": "30", "TF_CPP_MIN_LOG_LEVEL": "2", "TF_ENABLE_ONEDNN_OPTS": "0"}


def test_import_loads_no_framework():
    code = "import sys, collectives; print(sorted(m for m in ('torch', 'tensorflow', 'keras', 'mpi4py') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and out.stdout.strip() == "[]", out.stdout + out.stderr


def test_unified_torch():
    pytest.importorskip("torch")
    run = run_workers(2, "unified_worker.py", "torch", timeout=TIMEOUT, env=ENV)
    assert_all_ranks_passed(run, 2, min_cases=3)


# Three ranks (the torch face runs at two above): mixing frameworks is a matter of the Python
# layers, which do not depend on the number of ranks, and a second launch cost 13 s of CI's time.
def test_mixed_frameworks():
    pytest.importorskip("torch")
    pytest.importorskip("tensorflow")
    run = run_workers(3, "unified_worker.py", "mixed", timeout=TIMEOUT, env=ENV)
    assert_all_ranks_passed(run, 3, min_cases=2)
