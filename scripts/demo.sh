#!/usr/bin/env bash
# Sets up ./.venv with PyTorch and TensorFlow (first run: a few minutes) and runs the demo:
# a torch model and a Keras model trained side by side on 2 ranks, checked against
# single-process training.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup_env.sh frameworks
exec .venv/bin/collectivesrun -np "${NP:-2}" .venv/bin/python examples/mixed_torch_tf.py --check "$@"
