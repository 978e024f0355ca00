#!/usr/bin/env bash
# The framework matrix (scripts/framework_matrix.py says what it runs): builds the wheel for each
# Python, installs it with each cell's torch / tensorflow-cpu / tf-keras in a fresh environment,
# runs the face tests against it and writes docs/compatibility.md. Heavy (several GB of downloads,
# 5-10 minutes a cell on 2 cores): not part of .ci/run.
#   bash scripts/framework_matrix.sh [cell ...] [--page]
set -euo pipefail
cd "$(dirname "$0")/.."
exec "${PYTHON_FOR_MATRIX:-python3}" scripts/framework_matrix.py "$@"
