#!/usr/bin/env bash
# Sets up ./.venv (first run: about a minute) and runs the demo on 2 ranks.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup_env.sh
exec .venv/bin/mpirun -np "${NP:-2}" .venv/bin/python examples/numpy_allreduce.py
