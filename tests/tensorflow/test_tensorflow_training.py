"""Training with collectives.tensorflow and collectives.keras on real ranks.

One mpirun launch of ``tests/tensorflow/workers/tf_train_worker.py`` (see its docstring): training
equivalence with one process on the whole batch for DistributedGradientTape (eager and
tf.function; groups, predivide, Sum, fp16, IndexedSlices) and for model.fit with
DistributedOptimizer (SGD, Adam, backward_passes_per_step=2, fp16) and a custom loop;
the callbacks; jit_compile=True; mixed_float16; and a saved model that the test then loads
with plain Keras in a process that never imports collectives. The last tests run
examples/tensorflow_mnist.py and examples/keras_mnist.py end to end.
"""
import os
import re
import subprocess
import sys

import pytest

pytest.importorskip("tensorflow")

from mpi_launch import assert_all_ranks_passed, mpirun_path, run_workers  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TF_ENV = {"TF_CPP_MIN_LOG_LEVEL": "2", "TF_ENABLE_ONEDNN_OPTS": "0"}
TIMEOUT = 240

LOAD_WITHOUT_COLLECTIVES = """
import sys
import numpy as np
import keras
model = keras.models.load_model(sys.argv[1])
saved = np.load(sys.argv[1] + ".npz")
for i, w in enumerate(model.get_weights()):
    np.testing.assert_array_equal(w, saved[f"arr_{i}"])
assert type(model.optimizer) is keras.optimizers.Adam, type(model.optimizer)
assert int(model.optimizer.iterations) == 2
assert not any(m == "collectives" or m.startswith("collectives.") for m in sys.modules), "collectives was imported"
print("loaded without collectives")
"""


def test_tensorflow_training(tmp_path):
    saved = str(tmp_path / "trained.keras")
    run = run_workers(2, "tf_train_worker.py", "--save", saved, "tape", "fit", "callbacks", "save",
                      timeout=TIMEOUT, env=TF_ENV)
    assert_all_ranks_passed(run, 2, min_cases=35)
    # The saved model loads with plain Keras in a process that never imports collectives.
    env = dict(os.environ, **TF_ENV)
    proc = subprocess.run([sys.executable, "-c", LOAD_WITHOUT_COLLECTIVES, saved], capture_output=True, text=True,
                          env=env, timeout=120, cwd=str(tmp_path))
    assert proc.returncode == 0 and "loaded without collectives" in proc.stdout, proc.stdout + proc.stderr


def run_example(name, *args):
    env = dict(os.environ, OMP_NUM_THREADS="1", **TF_ENV)
    cmd = [mpirun_path(), "-np", "2", sys.executable, os.path.join(ROOT, "examples", name), *args]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=TIMEOUT, env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    losses = [float(x) for x in re.findall(r"train loss ([0-9.]+)", proc.stdout)]
    assert len(losses) == 3, proc.stdout
    assert losses[-1] < 0.5 * losses[0], proc.stdout
    return proc.stdout


def test_tensorflow_mnist_example():
    out = run_example("tensorflow_mnist.py", "--train-size", "2048")
    assert float(re.findall(r"accuracy ([0-9.]+)%", out)[-1]) > 80, out


def test_keras_mnist_example():
    out = run_example("keras_mnist.py", "--train-size", "2048")
    final = re.findall(r"final: test loss [0-9.]+  accuracy ([0-9.]+)% \(averaged over 2 ranks\)", out)
    assert final and float(final[0]) > 80, out
