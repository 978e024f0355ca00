#!/usr/bin/env bash
# GPU check of collectives (issue 6). On a machine with an NVIDIA GPU, a CUDA build of PyTorch
# and CuPy but nothing of ours: installs MPICH and mpi4py, builds the engine, finds out whether
# two ranks can share one GPU in one NCCL communicator, runs the GPU tests and benchmarks, and
# writes a short report (gpu-check-report.md) with the logs beside it.
#
#   bash scripts/gpu-check.sh [REPORT_DIR]
#       REPORT_DIR: $OUT when set (the device tool brings it back), else ./gpu-check-report
#   bash scripts/gpu-check.sh --fetch-wheels [DIR] [PYTHON_VERSION]
#       on a machine with network: the MPICH and mpi4py wheels (for Python 3.12 by default)
#       into DIR (default .whl, which git ignores) for a GPU machine without network
#
# Environment: PYTHON (default python3, the one with PyTorch), COLLECTIVES_WHEELHOUSE (default
# ./.whl; used when it holds an mpich wheel, else the package index), GPU_CHECK_FULL=1 (also:
# the GPU tests again at one rank, and the host collectives tests). About 5 minutes; 8 with
# GPU_CHECK_FULL=1.
#
# Two ranks on one GPU: NCCL refuses two ranks of one communicator on the same device unless
# they look like different hosts. The tests and benchmarks then give each rank its own
# NCCL_HOSTID and let NCCL talk over sockets on loopback (COLLECTIVES_TEST_SHARED_GPU=1).
set -uo pipefail
cd "$(dirname "$0")/.."
REPO=$(pwd)
PY=${PYTHON:-python3}

if [ "${1:-}" = --fetch-wheels ]; then
  DIR=${2:-.whl}
  PYVER=${3:-3.12}
  mkdir -p "$DIR"
  exec "$PY" -m pip download --no-deps --only-binary=:all: --python-version "$PYVER" --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    --platform manylinux_2_5_x86_64 --platform manylinux1_x86_64 -d "$DIR" mpich==5.0.2 mpi4py==4.1.2
fi

REPORT=${1:-${OUT:-$REPO/gpu-check-report}}
mkdir -p "$REPORT"
STATE=$(mktemp -d /tmp/gpu-check.XXXXXX)
SETUP_LOG=$REPORT/setup-build.log
export PYTHONUNBUFFERED=1 OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
say() { echo "gpu-check: $*" | tee -a "$SETUP_LOG"; }
record() { echo "$1=$2" >>"$STATE/state"; }
: >"$SETUP_LOG"
: >"$STATE/state"
record started "$(date -u +%Y-%m-%dT%H:%M:%SZ)"

# ---------------------------------------------------------------- machine
{
  echo "## nvidia-smi"
  nvidia-smi 2>&1 | head -20 || echo "nvidia-smi not available"
  echo "## python"
  "$PY" -c 'import sys; print(sys.executable, sys.version)'
  "$PY" -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda, "devices", torch.cuda.device_count())' 2>&1
  "$PY" -c 'import cupy; print("cupy", cupy.__version__)' 2>&1 | tail -1
} >"$STATE/machine.txt" 2>&1
cat "$STATE/machine.txt" >>"$SETUP_LOG"
NGPU=$("$PY" -c 'import torch; print(torch.cuda.device_count() if torch.cuda.is_available() else 0)' 2>/dev/null || echo 0)
record gpus "$NGPU"
[ "$NGPU" -ge 1 ] || record gpu "FAILED: PyTorch sees no CUDA GPU here; the GPU tests skip and no benchmark runs"

# ---------------------------------------------------------------- MPI (MPICH + mpi4py)
BIN=$("$PY" -c 'import os, sys; print(os.path.dirname(sys.executable))')
WHEELHOUSE=${COLLECTIVES_WHEELHOUSE:-$REPO/.whl}
PIP=("$PY" -m pip install --disable-pip-version-check --no-compile)
if [ -x "$BIN/mpicc" ] && "$PY" -c 'import mpi4py.MPI' >/dev/null 2>&1; then
  MPI_FROM="already installed beside $PY"
elif ls "$WHEELHOUSE"/mpich-*.whl >/dev/null 2>&1; then
  MPI_FROM="wheels in $WHEELHOUSE"
  # shellcheck disable=SC2046
  "${PIP[@]}" --no-index --no-deps "$WHEELHOUSE"/mpich-*.whl $(ls "$WHEELHOUSE"/mpi4py-*.whl 2>/dev/null) >>"$SETUP_LOG" 2>&1
else
  MPI_FROM="the package index"
  "${PIP[@]}" mpich "mpi4py>=4.0" >>"$SETUP_LOG" 2>&1
fi
MPI_VERSION=$("$PY" -c 'from mpi4py import MPI; print(MPI.Get_library_version().splitlines()[0])' 2>>"$SETUP_LOG")
if [ -x "$BIN/mpicc" ] && [ -n "$MPI_VERSION" ]; then
  record mpi "ok: $MPI_VERSION (from $MPI_FROM)"
else
  record mpi "FAILED (from $MPI_FROM; see setup-build.log; without network run --fetch-wheels elsewhere and carry .whl)"
fi
say "MPI: $MPI_VERSION from $MPI_FROM"

# ---------------------------------------------------------------- build
say "building the engine"
BUILD=ok
timeout 600 "$PY" setup.py build_ext --inplace >>"$SETUP_LOG" 2>&1 || BUILD=FAILED
# The editable install maps collectives.adapters to adapters/ (as scripts/setup_env.sh does).
if [ $BUILD = ok ] && ! (cd /tmp && "$PY" -c 'import collectives.adapters' >/dev/null 2>&1); then
  "${PIP[@]}" --no-index --no-deps --no-build-isolation -e . >>"$SETUP_LOG" 2>&1 || BUILD=FAILED
fi
record build "$BUILD"
"$PY" - >"$STATE/libs.txt" 2>&1 <<'EOF'
import collectives as hvd
from collectives._loader import engine_module
hvd.init()
info = engine_module().gpu_info()
print(f"nccl_built()={hvd.nccl_built()} cuda_built()={hvd.cuda_built()} available={info['available']}")
print(f"NCCL: {info['nccl_path'] or '-'}; CUDA driver version {info['cuda_driver_version']}")
if info["problem"]:
    print("problem:", info["problem"])
hvd.shutdown()
EOF
cat "$STATE/libs.txt" >>"$SETUP_LOG"

# ---------------------------------------------------------------- ranks sharing one GPU
NP=1
SHARED=0
PROBE_LOG=$REPORT/probe.log
: >"$PROBE_LOG"
if [ "$NGPU" -ge 2 ]; then
  NP=2
  record probe "not needed: $NGPU GPUs, one per rank"
elif [ "$NGPU" = 1 ] && [ $BUILD = ok ]; then
  cat >"$STATE/probe.py" <<'EOF'
import os, sys
rank = os.environ.get("PMI_RANK", "0")
os.environ["NCCL_HOSTID"] = f"collectives-probe-host-{rank}"
for k, v in (("NCCL_SOCKET_IFNAME", "lo"), ("NCCL_IB_DISABLE", "1"), ("NCCL_P2P_DISABLE", "1"),
             ("NCCL_SHM_DISABLE", "1"), ("NCCL_NVLS_ENABLE", "0"), ("NCCL_CUMEM_ENABLE", "0")):
    os.environ.setdefault(k, v)
import torch
import collectives.torch as hvd
hvd.init()
torch.cuda.set_device(0)
x = torch.full((1 << 20,), float(hvd.rank() + 1), device="cuda")
ok = bool(torch.all(hvd.allreduce(x, op=hvd.Sum) == 3).item())
ok = ok and hvd.allgather(x[:2]).shape[0] == 4
print(f"[rank {hvd.rank()}] two ranks on one GPU: {'ok' if ok else 'WRONG RESULT'}", flush=True)
hvd.shutdown()
sys.exit(0 if ok else 1)
EOF
  if timeout 180 "$BIN/mpirun" -np 2 "$PY" "$STATE/probe.py" >>"$PROBE_LOG" 2>&1; then
    NP=2
    SHARED=1
    record probe "ok: 2 ranks share the GPU (distinct NCCL_HOSTID, sockets on loopback); GPU tests run at np=2"
  else
    record probe "FAILED (see probe.log): GPU tests run at np=1 only"
  fi
else
  record probe "skipped (gpus=$NGPU, build=$BUILD)"
fi
say "GPU tests at np=$NP (shared GPU: $SHARED)"

# ---------------------------------------------------------------- tests
TESTS_LOG=$REPORT/tests.log
: >"$TESTS_LOG"
run_pytest() {  # label, env..., -- pytest args
  local label=$1
  shift
  echo "===== $label" >>"$TESTS_LOG"
  local start=$SECONDS
  env "$@" >>"$TESTS_LOG" 2>&1
  local rc=$?
  local summary
  summary=$(grep -E "^(=+ )?[0-9]+ (passed|failed|skipped|error)|no tests ran" "$TESTS_LOG" | tail -1 | sed 's/=//g')
  record "test: $label" "$( [ $rc = 0 ] && echo ok || echo "FAILED (rc $rc)"): ${summary:-no summary} [$((SECONDS - start)) s]"
}
if [ $BUILD = ok ]; then
  SHARED_ENV=()
  [ $SHARED = 1 ] && SHARED_ENV=(COLLECTIVES_TEST_SHARED_GPU=1)
  run_pytest "GPU tests at np $NP" COLLECTIVES_GPU_TEST_NP=$NP "${SHARED_ENV[@]}" \
    timeout 900 "$PY" -m pytest -q -rfEs -p no:cacheprovider tests/test_gpu.py
  run_pytest "GPU library loading and stand-ins" \
    timeout 300 "$PY" -m pytest -q -rfEs -p no:cacheprovider tests/test_gpu_loader.py tests/test_gpu_libs.py
  if [ "${GPU_CHECK_FULL:-0}" = 1 ]; then
    [ $NP = 2 ] && run_pytest "GPU tests at np 1" COLLECTIVES_GPU_TEST_NP=1 \
      timeout 900 "$PY" -m pytest -q -rfEs -p no:cacheprovider tests/test_gpu.py
    run_pytest "host collectives (test_ops, test_torch_ops)" \
      timeout 600 "$PY" -m pytest -q -rfEs -p no:cacheprovider tests/test_ops.py tests/test_torch_ops.py
  fi
fi

# ---------------------------------------------------------------- benchmarks
BENCH_LOG=$REPORT/bench.log
: >"$BENCH_LOG"
if [ $BUILD = ok ] && [ "$NGPU" -ge 1 ]; then
  BENCH_ENV=()
  [ $SHARED = 1 ] && BENCH_ENV=(COLLECTIVES_TEST_SHARED_GPU=1)
  if env "${BENCH_ENV[@]}" timeout 400 "$BIN/mpirun" -np $NP "$PY" scripts/gpu_bench.py --json "$REPORT/bench.json" \
      >>"$BENCH_LOG" 2>&1; then
    record "bench at np $NP" ok
  else
    record "bench at np $NP" "FAILED (see bench.log)"
  fi
  if [ $NP = 2 ]; then
    echo "===== np=1" >>"$BENCH_LOG"
    if timeout 300 "$BIN/mpirun" -np 1 "$PY" scripts/gpu_bench.py --no-torch-distributed \
        --json "$REPORT/bench-np1.json" >>"$BENCH_LOG" 2>&1; then
      record "bench at np 1" ok
    else
      record "bench at np 1" "FAILED (see bench.log)"
    fi
  fi
fi
record finished "$(date -u +%Y-%m-%dT%H:%M:%SZ)"

# ---------------------------------------------------------------- report
"$PY" - "$STATE" "$REPORT" <<'EOF'
import json, os, sys
state_dir, report = sys.argv[1], sys.argv[2]
state = [line.rstrip("\n").split("=", 1) for line in open(os.path.join(state_dir, "state")) if "=" in line]
get = dict(state).get
def read(path):
    try:
        return open(path).read().strip()
    except OSError:
        return "(missing)"
out = ["# collectives GPU check", "", f"{get('started')} to {get('finished')}", "", "## Machine", "", "```",
       read(os.path.join(state_dir, "machine.txt")), "```", "", f"- GPUs seen by PyTorch: {get('gpus')}",
       *([f"- {get('gpu')}"] if get("gpu") else []), "",
       "## Setup", "", f"- MPI: {get('mpi')}", f"- build: {get('build')} (setup-build.log)", "",
       "Libraries as the engine loaded them:", "", "```", read(os.path.join(state_dir, "libs.txt")), "```", "",
       "## Ranks sharing one GPU", "", f"- {get('probe')}", "", "## Tests", ""]
out += [f"- {k[6:]}: {v}" for k, v in state if k.startswith("test: ")] or ["- not run"]
out += ["", "(tests.log has the output; failures are listed at its end)", "", "## Benchmarks", ""]
out += [f"- {k}: {v}" for k, v in state if k.startswith("bench")] or ["- not run"]
bench = read(os.path.join(report, "bench.log"))
lines = [l for l in bench.splitlines() if l.startswith(("GPU benchmarks", "  ", "====="))]
out += ["", "```", "\n".join(lines) or "(no results)", "```", ""]
for name in ("bench.json", "bench-np1.json"):
    path = os.path.join(report, name)
    if os.path.exists(path):
        r = json.load(open(path))
        out.append(f"- {name}: {r['ranks']} rank(s){' sharing one GPU' if r.get('shared_gpu') else ''}: "
                   f"256 MiB allreduce busbw {r['allreduce_busbw_GBps']:.1f} GB/s vs copy {r['copy_GBps']:.1f} GB/s; "
                   f"161 fused gradients {r['fused_161_s'] * 1e3:.2f} ms vs one call {r['one_call_flat_s'] * 1e3:.2f} ms "
                   f"({r['fused_over_one_call']:.2f}x); 8-byte latency {r['latency_8B_s'] * 1e6:.1f} us")
out.append("")
text = "\n".join(out)
open(os.path.join(report, "gpu-check-report.md"), "w").write(text + "\n")
print(text)
EOF
rm -rf "$STATE"
grep -q "FAILED" "$REPORT/gpu-check-report.md" && exit 1
exit 0
