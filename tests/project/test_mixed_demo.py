"""The README's demo: examples/mixed_torch_tf.py under collectivesrun on 2 ranks trains a torch
and a Keras model in the same processes, and both match single-process training."""
import os
import re
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_mixed_demo_matches_single_process():
    pytest.importorskip("torch")
    pytest.importorskip("tensorflow")
    cmd = [sys.executable, "-m", "collectives.run", "-np", "2", sys.executable,
           os.path.join(ROOT, "examples", "mixed_torch_tf.py"), "--check", "--steps", "12"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=180)
    out = proc.stdout
    assert proc.returncode == 0, out + proc.stderr
    assert "torch model matches single-process training: True" in out, out
    assert "keras model matches single-process training: True" in out, out
    torch_losses = [float(x) for x in re.findall(r"torch loss ([0-9.]+)", out)]
    keras_losses = [float(x) for x in re.findall(r"keras loss ([0-9.]+)", out)]
    assert len(torch_losses) >= 3 and torch_losses[-1] < torch_losses[0], out
    assert len(keras_losses) >= 3 and keras_losses[-1] < keras_losses[0], out
