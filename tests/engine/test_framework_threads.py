"""Default thread pools at init(): cores // ranks on the machine for torch and TensorFlow,
unless the user set OMP_NUM_THREADS / TF_NUM_INTRAOP_THREADS or the knob says otherwise."""
import os
import subprocess
import sys

import pytest

from collectives import framework_threads
from mpi_launch import mpirun_path

CORES = os.cpu_count() or 1


def test_threads_per_rank():
    assert framework_threads.threads_per_rank(None, 2) == max(1, CORES // 2)
    assert framework_threads.threads_per_rank(None, 10 * CORES) == 1
    assert framework_threads.threads_per_rank(0, 2) is None
    assert framework_threads.threads_per_rank(5, 2) == 5


# torch imported before init (configured through its API), TensorFlow after (through the
# environment variables it reads at start-up).
WORKER = """
import os, torch
import collectives as hvd
hvd.init()
import tensorflow as tf
tf.constant(1.0) + 1.0
with open(os.path.join(os.environ["RESULT_DIR"], str(hvd.rank())), "w") as f:
    f.write(f"{hvd.rank()} {torch.get_num_threads()} {os.environ.get('TF_NUM_INTRAOP_THREADS')}")
"""


def test_defaults_and_user_settings_under_mpirun(tmp_path):
    """One launch of three ranks (MPMD): rank 0 with defaults, rank 1 with the knob set to 3,
    rank 2 with OMP_NUM_THREADS / TF_NUM_INTRAOP_THREADS set to 2."""
    pytest.importorskip("torch")
    pytest.importorskip("tensorflow")
    env = {k: v for k, v in os.environ.items()
           if k not in ("OMP_NUM_THREADS", "TF_NUM_INTRAOP_THREADS", "COLLECTIVES_FRAMEWORK_THREADS")}
    env["TF_CPP_MIN_LOG_LEVEL"] = "2"
    env["RESULT_DIR"] = str(tmp_path)  # files, not stdout: the ranks' output lines can interleave
    rank = [sys.executable, "-c", WORKER]
    cmd = [mpirun_path(), "-np", "1", *rank, ":",
           "-np", "1", "-env", "COLLECTIVES_FRAMEWORK_THREADS", "3", *rank, ":",
           "-np", "1", "-env", "OMP_NUM_THREADS", "2", "-env", "TF_NUM_INTRAOP_THREADS", "2", *rank]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    got = sorted(f.read_text().split() for f in tmp_path.iterdir())
    n = str(max(1, CORES // 3))
    assert got == [["0", n, n], ["1", "3", "3"], ["2", "2", "2"]], proc.stdout + proc.stderr
