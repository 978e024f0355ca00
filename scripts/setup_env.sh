#!/usr/bin/env bash
# Creates ./.venv with everything collectives needs and builds the engine into it (editable).
#   scripts/setup_env.sh             runtime only (numpy, mpi4py, the MPICH wheel)
#   scripts/setup_env.sh frameworks  plus the CPU builds of PyTorch and TensorFlow (the demo)
#   scripts/setup_env.sh test        plus those, the test tools and Ray (collectives[ray])
#   scripts/setup_env.sh bench       plus those and matplotlib (benchmarks/plot_*.py)
# On a fresh Debian/Ubuntu machine it installs the compiler, Python headers and venv module
# with apt-get when run as root (otherwise it says which packages are missing).
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}

missing=()
command -v c++ >/dev/null 2>&1 || missing+=(g++)
"$PYTHON" -c 'import sysconfig, os, sys; sys.exit(not os.path.exists(os.path.join(sysconfig.get_paths()["include"], "Python.h")))' \
  || missing+=(python3-dev)
"$PYTHON" -c 'import ensurepip, venv' >/dev/null 2>&1 || missing+=(python3-venv)
if [ ${#missing[@]} -gt 0 ]; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "setup: installing ${missing[*]} with apt-get"
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
  else
    echo "setup: please install: ${missing[*]} (e.g. sudo apt-get install ${missing[*]})" >&2
    exit 1
  fi
fi

[ -x .venv/bin/python ] || "$PYTHON" -m venv .venv
# Not --no-compile: where PYTHONDONTWRITEBYTECODE is set (as on CI's machines), nothing would ever
# write the .pyc files, and every process would compile TensorFlow's modules on import again.
PIP=(.venv/bin/python -m pip install --quiet --disable-pip-version-check)
"${PIP[@]}" setuptools wheel "pybind11>=2.12" mpich "mpi4py>=4.0" "numpy>=1.23" "cloudpickle>=2"
MODE=${1:-}
if [ "$MODE" = frameworks ] || [ "$MODE" = test ] || [ "$MODE" = bench ]; then
  # torch: the pinned CPU build (+cpu), so a multi-GB CUDA build is never pulled;
  # tensorflow-cpu: TensorFlow without CUDA libraries (brings Keras 3); tf-keras: Keras 2, the
  # version matching TensorFlow's (what TF_USE_LEGACY_KERAS=1 makes tf.keras be), so both Kerases
  # collectives supports are tested.
  "${PIP[@]}" "torch==2.13.0+cpu" "tensorflow-cpu==2.21.0" "tf-keras==2.21.0"
fi
if [ "$MODE" = test ] || [ "$MODE" = bench ]; then
  "${PIP[@]}" "pytest>=7" "hypothesis>=6" "ml_dtypes>=0.3" "psutil>=5" "pyyaml>=6" "jsonschema>=4"
  # OpenSSH's sshd for the simulated Kubernetes pods (tests/clusters/); the tests skip without it.
  # Installed only where policy-rc.d stops Debian from starting it as a service (containers, CI):
  # the tests start their own sshds inside the simulated pods.
  if ! [ -x /usr/sbin/sshd ] && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1 \
     && [ -x /usr/sbin/policy-rc.d ]; then
    echo "setup: installing openssh-server with apt-get (sshd for tests/clusters/)"
    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq openssh-server >/dev/null) \
      || echo "setup: could not install openssh-server; the simulated-pod tests will skip" >&2
  fi
  # collectives[ray]: tests/clusters/test_ray_*.py run against the real Ray (they skip without it)
  "${PIP[@]}" "ray==2.60.0"
fi
if [ "$MODE" = bench ]; then
  "${PIP[@]}" "matplotlib>=3.5"  # only the plots need it; the tests skip their plot check without it
fi
# --no-build-isolation: build against the MPICH in .venv, the one the engine runs with.
"${PIP[@]}" --no-build-isolation -e .
