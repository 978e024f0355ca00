#!/usr/bin/env bash
# GPU check of collectives, in stages that each fit one command of at most 10 minutes on a
# GPU machine that has a CUDA build of PyTorch (and CuPy) but nothing of ours and no network:
#
#   bash scripts/gpu-check.sh [--report DIR] STAGE...     STAGE: setup, tests, bench, extra, zero, all
#     setup  machine facts; the Python packages the build and tests need (the machine's own,
#            else carried wheels); MPICH and mpi4py from carried wheels, checked to be one MPI;
#            the engine built; whether two ranks can share one GPU. Done once per machine:
#            later stages reuse it (state in build/gpu-check) and run it first when missing.
#     tests  the header check and GPU library tests, then tests/gpu/test_gpu.py at 2 ranks (or 1).
#     bench  scripts/gpu_bench.py at 2 ranks and at 1: allreduce and fusion against raw NCCL
#            and a device copy, DistributedOptimizer's training step against torch DDP; then the
#            fused gradients again with COLLECTIVES_GPU_FUSION_WAIT=0.
#     extra  the GPU tests at one rank, fusion without the batched copy kernel, the host
#            collectives tests.
#     zero   benchmarks/zero_bench.py --device cuda at 1 and 2 ranks: DistributedOptimizer(zero_stage=
#            0/1/2) memory per rank (optimizer state, gradients held, peak GPU memory) and step
#            time against DDP + torch's ZeroRedundancyOptimizer over NCCL; the table in the report.
#     holds  the fused gradients and the training step (with the NCCL calls each took) for each
#            COLLECTIVES_GPU_FUSION_WAIT_MS in GPU_CHECK_HOLDS (default "1 5 20 100"; a value
#            may repeat, for interleaved rounds), each in a launch of its own.
#   Every step has a time limit taken from the command's budget (GPU_CHECK_BUDGET_S, 540 s),
#   so the command ends in time, and the report is rewritten after each step:
#   DIR/gpu-check-report.md (DIR: --report, else $OUT, else ./gpu-check-report) with the logs
#   beside it (at most 6 files).
#
#   bash scripts/gpu-check.sh --fetch-wheels [DIR]
#     on a machine with network: the wheels a GPU machine may lack, for Python 3.12 on
#     manylinux x86-64, into DIR (default .whl, which git ignores): MPICH, mpi4py, pybind11,
#     pytest and its dependencies, ml_dtypes, setuptools (numpy is not carried: PyTorch has it).
#
# Environment: PYTHON (default python3, the one with PyTorch), COLLECTIVES_WHEELHOUSE (default
# ./.whl), COLLECTIVES_MPICC (an MPI to use instead of the carried MPICH).
#
# Two ranks on one GPU: NCCL refuses two ranks of one communicator on the same device unless
# they look like different hosts. The tests and benchmarks then give each rank its own
# NCCL_HOSTID and let NCCL talk over sockets on loopback (COLLECTIVES_TEST_SHARED_GPU=1).
set -uo pipefail
cd "$(dirname "$0")/.."
REPO=$(pwd)
PY=${PYTHON:-python3}
WHEELHOUSE=${COLLECTIVES_WHEELHOUSE:-$REPO/.whl}

# Pinned: the versions the rehearsal used (docs/gpus.md).
WHEELS=(mpich==5.0.2 mpi4py==4.1.2 pybind11==3.1.0 pytest==9.2.0 iniconfig==2.3.1 packaging==26.3 pluggy==1.7.0
        pygments==2.21.0 ml_dtypes==0.6.0 setuptools==84.2.1)

if [ "${1:-}" = --fetch-wheels ]; then
  DIR=${2:-.whl}
  mkdir -p "$DIR"
  exec "$PY" -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 --platform manylinux_2_5_x86_64 --platform manylinux1_x86_64 \
    -d "$DIR" "${WHEELS[@]}"
fi

REPORT=${OUT:-$REPO/gpu-check-report}
if [ "${1:-}" = --report ]; then REPORT=$2; shift 2; fi
STAGES=("$@")
[ ${#STAGES[@]} -gt 0 ] || STAGES=(all)
[ "${STAGES[*]}" = all ] && STAGES=(setup tests bench)
mkdir -p "$REPORT"
STATE=$REPO/build/gpu-check
mkdir -p "$STATE"
export PYTHONUNBUFFERED=1 OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
BUDGET=${GPU_CHECK_BUDGET_S:-540}
START=$SECONDS

remaining() { echo $((BUDGET - (SECONDS - START))); }
# A step's time limit: at most $1 s, and never past the budget less $2 s kept for later steps.
limit() {
  local left
  left=$(($(remaining) - ${2:-15}))
  [ "$left" -lt "$1" ] && echo "$left" || echo "$1"
}
log() { echo "gpu-check: $*" | tee -a "$STATE/$LOG_STAGE.log"; }
# key=value lines in the state (last one wins), and report lines per stage.
put() { echo "$1=$2" >>"$STATE/state"; }
get() { grep "^$1=" "$STATE/state" 2>/dev/null | tail -1 | cut -d= -f2-; }
part() { echo "$2" >>"$STATE/part-$1.md"; report; }
report() { "$PY" scripts/gpu_report.py "$STATE" "$REPORT" >/dev/null 2>&1 || cp "$STATE"/*.md "$REPORT"/ 2>/dev/null; }

# ---------------------------------------------------------------- setup

pip_install() {  # pip install into the environment the checks run in, from the wheelhouse only
  if [ -n "$(get overlay)" ]; then
    "$PY" -m pip install --disable-pip-version-check --no-compile --no-index --find-links "$WHEELHOUSE" \
      --prefix "$(get overlay)" "$@"
  else
    "$PY" -m pip install --disable-pip-version-check --no-compile --no-index --find-links "$WHEELHOUSE" "$@"
  fi
}

stage_setup() {
  LOG_STAGE=setup
  # Done already on this machine, for these sources: nothing to do.
  local sources
  sources=$( (find csrc -type f | LC_ALL=C sort | xargs cat; cat setup.py) 2>/dev/null | md5sum | cut -c1-16)
  if [ "$(get setup)" = ok ] && [ "$(get sources)" = "$sources" ] && [ -x "$(get python)" ] &&
      (cd /tmp && "$(get python)" -c 'import collectives._engine') 2>/dev/null; then
    PY=$(get python)
    return 0
  fi
  : >"$STATE/state"
  : >"$STATE/setup.log"
  : >"$STATE/part-setup.md"
  put started "$(date -u +%Y-%m-%dT%H:%M:%SZ)"
  {
    echo '```'
    if command -v nvidia-smi >/dev/null; then
      nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>&1 | head -4
    else
      echo "no nvidia-smi"
    fi
    "$PY" -c 'import sys; print("python", sys.version.split()[0], sys.executable)'
    "$PY" -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda, "gpus", torch.cuda.device_count())' 2>&1 | tail -1
    "$PY" -c 'import cupy; print("cupy", cupy.__version__)' 2>&1 | tail -1
    "$PY" -m pip list 2>/dev/null | grep -i -E "^(nvidia-nccl|mpi4py|mpich|pybind11|pytest|ml.dtypes|numpy) " | tr -s ' ' | tr '\n' ';'
    echo
    (command -v nvcc >/dev/null && nvcc --version | tail -2 | head -1) || echo "no nvcc"
    echo '```'
  } >>"$STATE/part-setup.md" 2>&1
  NGPU=$("$PY" -c 'import torch; print(torch.cuda.device_count() if torch.cuda.is_available() else 0)' 2>/dev/null || echo 0)
  put gpus "$NGPU"
  [ "$NGPU" -ge 1 ] || part setup "- FAILED: PyTorch sees no CUDA GPU: the GPU tests skip and no benchmark runs"

  # Where packages go: the Python's own environment, or (not writable) an overlay venv in
  # /tmp that sees the Python's packages and shadows them with ours.
  if [ "${GPU_CHECK_OVERLAY:-0}" = 1 ] || ! "$PY" -c 'import os, sys, sysconfig; sys.exit(not all(os.access(p, os.W_OK) for p in (sysconfig.get_paths()["purelib"], sysconfig.get_paths()["scripts"])))'; then
    OVERLAY=/tmp/collectives-venv
    rm -rf "$OVERLAY"
    "$PY" -m venv --without-pip "$OVERLAY" >>"$STATE/setup.log" 2>&1 || { part setup "- FAILED: cannot create $OVERLAY"; return 1; }
    SITE=$("$OVERLAY/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
    "$PY" -c 'import sysconfig; print("import site; site.addsitedir(%r)" % sysconfig.get_paths()["purelib"])' >"$SITE/base-env.pth"
    put overlay "$OVERLAY"
    PY=$OVERLAY/bin/python
    log "the Python environment is not writable: packages go to the overlay $OVERLAY"
  fi
  put python "$(command -v "$PY" || echo "$PY")"

  # Build and test tools: the machine's when present, else carried wheels.
  local missing=() name module
  for name in setuptools:setuptools pybind11:pybind11 pytest:pytest ml_dtypes:ml_dtypes numpy:numpy; do
    module=${name#*:}
    "$PY" -c "import $module" >/dev/null 2>&1 || missing+=("${name%%:*}")
  done
  if [ ${#missing[@]} -gt 0 ]; then
    log "installing from $WHEELHOUSE: ${missing[*]}"
    if ! pip_install "${missing[@]}" >>"$STATE/setup.log" 2>&1; then
      part setup "- FAILED: ${missing[*]} missing here and not installable from $WHEELHOUSE (run \`bash scripts/gpu-check.sh --fetch-wheels\` where there is network and carry .whl); see setup.log"
      return 1
    fi
  fi
  part setup "- Python packages: $( [ ${#missing[@]} -gt 0 ] && echo "installed ${missing[*]} from carried wheels" || echo "all present") (setuptools, pybind11, pytest, ml_dtypes, numpy)"

  # One MPI for the engine and mpi4py: the carried MPICH (else $COLLECTIVES_MPICC, an MPI
  # beside Python, or one on PATH), mpirun from the same place, mpi4py reinstalled over it.
  local bin mpicc="" from=""
  # Where a wheel's data files (the MPICH wheel's bin/, lib/) land: the environment's prefix.
  bin=$("$PY" -c 'import sysconfig; print(sysconfig.get_paths()["data"] + "/bin")')
  if [ -n "${COLLECTIVES_MPICC:-}" ]; then
    mpicc=$COLLECTIVES_MPICC
    from="COLLECTIVES_MPICC"
  elif ls "$WHEELHOUSE"/mpich-*.whl >/dev/null 2>&1; then
    log "installing MPICH and mpi4py from $WHEELHOUSE"
    # shellcheck disable=SC2046
    pip_install --no-deps --force-reinstall "$WHEELHOUSE"/mpich-*.whl $(ls "$WHEELHOUSE"/mpi4py-*.whl 2>/dev/null) \
      >>"$STATE/setup.log" 2>&1 || { part setup "- FAILED: installing the carried MPICH/mpi4py wheels (setup.log)"; return 1; }
    mpicc=$bin/mpicc
    from="the carried MPICH wheel"
  elif [ -x "$bin/mpicc" ]; then
    mpicc=$bin/mpicc
    from="the MPI beside $PY"
  elif command -v mpicc >/dev/null; then
    mpicc=$(command -v mpicc)
    from="the MPI on PATH"
  fi
  if [ -z "$mpicc" ] || [ ! -x "$mpicc" ]; then
    part setup "- FAILED: no MPI here (no mpicc beside $PY or on PATH, and no mpich wheel in $WHEELHOUSE): run \`bash scripts/gpu-check.sh --fetch-wheels\` where there is network and carry .whl"
    return 1
  fi
  local mpirun
  mpirun=$(dirname "$mpicc")/mpirun
  [ -x "$mpirun" ] || mpirun=$(dirname "$mpicc")/mpiexec
  if [ ! -x "$mpirun" ]; then
    part setup "- FAILED: $mpicc has no mpirun or mpiexec beside it"
    return 1
  fi
  put mpicc "$mpicc"
  put mpirun "$mpirun"
  if ! "$PY" -c 'import mpi4py.MPI' >>"$STATE/setup.log" 2>&1; then
    part setup "- FAILED: mpi4py does not load with this MPI (setup.log); carry the mpi4py wheel (--fetch-wheels)"
    return 1
  fi

  # The engine, built against that MPI (editable: collectives.adapters maps to adapters/).
  log "building the engine against $mpicc"
  local t0=$SECONDS
  if ! COLLECTIVES_MPICC=$mpicc timeout "$(limit "${GPU_CHECK_BUILD_S:-300}" 120)" "$PY" -m pip install --disable-pip-version-check --no-index \
      --no-deps --no-build-isolation -e . $( [ -n "$(get overlay)" ] && echo "--prefix $(get overlay)") \
      >>"$STATE/setup.log" 2>&1; then
    part setup "- FAILED: building the engine (setup.log)"
    return 1
  fi
  local versions
  versions=$(cd /tmp && "$PY" - 2>>"$STATE/setup.log" <<'EOF'
from mpi4py import MPI
import collectives.adapters  # noqa: F401 - the editable install's mapping
from collectives._loader import engine_module
first = lambda s: s.strip().splitlines()[0].strip()
engine, mine = first(engine_module().mpi_library_version()), first(MPI.Get_library_version())
print("same" if engine == mine else "DIFFERENT", "|", engine, "|", mine)
EOF
)
  if [ "${versions%% *}" != same ]; then
    part setup "- FAILED: the engine and mpi4py use different MPI libraries (${versions:-import failed: setup.log}); carry the mpi4py wheel"
    return 1
  fi
  versions=${versions#*| }
  part setup "- MPI: ${versions%% |*} (the engine's and mpi4py's) from $from; mpicc $mpicc; mpirun $mpirun; engine built in $((SECONDS - t0)) s"
  "$PY" - >>"$STATE/part-setup.md" 2>>"$STATE/setup.log" <<'EOF'
import collectives as hvd
from collectives._loader import engine_module
hvd.init()
info = engine_module().gpu_info()
print(f"- libraries: nccl_built()={hvd.nccl_built()}, cuda_built()={hvd.cuda_built()}, available={info['available']}; "
      f"NCCL {info['nccl_path'] or '-'}; CUDA driver {info['cuda_driver_version']}"
      + (f"; problem: {info['problem']}" if info["problem"] else ""))
hvd.shutdown()
EOF

  # Ranks sharing one GPU.
  local np=1 shared=0
  if [ "$NGPU" -ge 2 ]; then
    np=2
    part setup "- GPU tests at 2 ranks, one GPU each"
  elif [ "$NGPU" = 1 ]; then
    if COLLECTIVES_TEST_SHARED_GPU=1 timeout "$(limit 120 60)" "$mpirun" -np 2 "$PY" scripts/gpu_bench.py --probe \
        >>"$STATE/setup.log" 2>&1; then
      np=2
      shared=1
      part setup "- two ranks share the GPU (each its own NCCL_HOSTID, sockets on loopback): GPU tests at 2 ranks"
    else
      part setup "- FAILED: two ranks could not share the GPU (setup.log): GPU tests at 1 rank only"
    fi
  fi
  put np "$np"
  put shared "$shared"
  put sources "$sources"
  put setup ok
  return 0
}

# ---------------------------------------------------------------- tests and benchmarks

run_pytest() {  # label, timeout, env assignments..., -- pytest arguments
  local label=$1 seconds=$2
  shift 2
  local vars=()
  while [ "$1" != -- ]; do vars+=("$1"); shift; done
  shift
  if [ "$seconds" -lt 20 ]; then
    part tests "- $label: not run (the command's time budget is spent)"
    return
  fi
  echo "===== $label (limit $seconds s)" >>"$STATE/tests.log"
  local t0=$SECONDS rc summary
  env ${vars[@]+"${vars[@]}"} PATH="$(dirname "$(get mpirun)"):$PATH" timeout "$seconds" "$PY" -m pytest -q -rfEs \
    -p no:cacheprovider "$@" >"$STATE/pytest.out" 2>&1
  rc=$?
  cat "$STATE/pytest.out" >>"$STATE/tests.log"
  summary=$(grep -E "^(=+ )?[0-9]+ (passed|failed|skipped|error)|no tests ran" "$STATE/pytest.out" | tail -1 | tr -d '=')
  [ $rc = 124 ] && summary="timed out after $seconds s; ${summary:-no summary}"
  part tests "- $label: $( [ $rc = 0 ] && echo ok || echo "FAILED (rc $rc)"): ${summary:-no summary} [$((SECONDS - t0)) s]"
  grep -E "^(FAILED|ERROR|SKIPPED)" "$STATE/pytest.out" | head -20 | sed 's/^/    /' >>"$STATE/part-tests.md"
}

stage_tests() {
  LOG_STAGE=tests
  : >"$STATE/part-tests.md"
  : >"$STATE/tests.log"
  local np shared=()
  np=$(get np)
  [ "$(get shared)" = 1 ] && shared=(COLLECTIVES_TEST_SHARED_GPU=1)
  run_pytest "headers, kernel and GPU libraries (test_gpu_api_headers, test_gpu_kernels, test_gpu_libs, test_gpu_loader)" \
    "$(limit 150 200)" -- tests/gpu/test_gpu_api_headers.py tests/gpu/test_gpu_kernels.py tests/gpu/test_gpu_libs.py tests/gpu/test_gpu_loader.py
  local left
  left=$(limit 420 10)
  run_pytest "GPU tests at $np rank(s)" "$left" COLLECTIVES_GPU_TEST_NP="$np" ${shared[@]+"${shared[@]}"} \
    COLLECTIVES_GPU_TEST_TIMEOUT=$((left > 200 ? 200 : left)) -- tests/gpu/test_gpu.py
}

stage_extra() {
  LOG_STAGE=tests
  : >"$STATE/part-tests.md"
  : >"$STATE/tests.log"
  run_pytest "GPU tests at 1 rank" "$(limit 240 200)" COLLECTIVES_GPU_TEST_NP=1 COLLECTIVES_GPU_TEST_TIMEOUT=150 -- \
    tests/gpu/test_gpu.py
  local np shared=()
  np=$(get np)
  [ "$(get shared)" = 1 ] && shared=(COLLECTIVES_TEST_SHARED_GPU=1)
  run_pytest "fusion and optimizer at $np rank(s) without the copy kernel" "$(limit 150 120)" COLLECTIVES_GPU_COPY_KERNEL=0 \
    COLLECTIVES_GPU_TEST_NP="$np" ${shared[@]+"${shared[@]}"} COLLECTIVES_GPU_TEST_TIMEOUT=120 -- tests/gpu/test_gpu.py -k "fusion or optimizer"
  run_pytest "host collectives (test_ops, test_torch_ops)" "$(limit 300 10)" -- tests/engine/test_ops.py tests/torch/test_torch_ops.py
}

# One launch of scripts/gpu_bench.py on $3 ranks within $4 seconds, reported in stage $1's part as
# "$2: ok/FAILED [time]"; then VAR=value assignments for it, "--", and gpu_bench.py's arguments.
bench_launch() {
  local stage=$1 label=$2 n=$3 seconds=$4
  shift 4
  local vars=()
  while [ "$1" != -- ]; do vars+=("$1"); shift; done
  shift
  [ "$(get shared)" = 1 ] && vars+=(COLLECTIVES_TEST_SHARED_GPU=1)
  echo "===== $label (limit $seconds s)" >>"$STATE/bench.log"
  local t0=$SECONDS rc
  env ${vars[@]+"${vars[@]}"} timeout "$seconds" "$(get mpirun)" -np "$n" "$PY" scripts/gpu_bench.py "$@" \
    >>"$STATE/bench.log" 2>&1
  rc=$?
  part "$stage" "- $label: $( [ $rc = 0 ] && echo ok || echo "FAILED (rc $rc, bench.log)") [$((SECONDS - t0)) s]"
}

stage_bench() {
  LOG_STAGE=bench
  : >"$STATE/part-bench.md"
  [ -n "${BENCH_LOG_OPEN:-}" ] || : >"$STATE/bench.log"  # bench and holds of one command share it
  BENCH_LOG_OPEN=1
  rm -f "$STATE"/bench-np*.json "$STATE"/bench-nowait.json
  local gpus
  gpus=$(get gpus)
  if [ "${gpus:-0}" -lt 1 ]; then
    part bench "- not run: no GPU"
    return
  fi
  local np
  np=$(get np)
  local runs=("$np")
  [ "$np" = 2 ] && runs=(2 1)
  local n seconds
  for n in "${runs[@]}"; do
    seconds=$(limit $((n == 2 ? 280 : 200)) $((n == 2 && ${#runs[@]} == 2 ? 110 : 50)))
    if [ "$seconds" -lt 30 ]; then
      part bench "- np=$n: not run (the command's time budget is spent)"
      continue
    fi
    bench_launch bench "np=$n" "$n" "$seconds" -- --time-limit $((seconds - 20)) --json "$STATE/bench-np$n.json"
  done
  # The fused gradients again without waiting for a busy GPU (COLLECTIVES_GPU_FUSION_WAIT=0).
  seconds=$(limit 90 5)
  if [ "$seconds" -lt 40 ]; then
    part bench "- np=$np without the fusion wait: not run (the command's time budget is spent)"
    return
  fi
  bench_launch bench "np=$np without the fusion wait" "$np" "$seconds" COLLECTIVES_GPU_FUSION_WAIT=0 -- \
    --sections fused --time-limit $((seconds - 20)) --json "$STATE/bench-nowait.json"
}

# How long GPU work waits for a busy GPU (COLLECTIVES_GPU_FUSION_WAIT_MS): the fused gradients
# and the training step, with the NCCL calls each took, for each value of GPU_CHECK_HOLDS.
stage_holds() {
  LOG_STAGE=bench
  : >"$STATE/part-holds.md"
  [ -n "${BENCH_LOG_OPEN:-}" ] || : >"$STATE/bench.log"  # bench and holds of one command share it
  BENCH_LOG_OPEN=1
  rm -f "$STATE"/bench-hold-*.json
  if [ "$(get gpus)" -lt 1 ] 2>/dev/null; then
    part holds "- not run: no GPU"
    return
  fi
  local np ms seconds n=0
  np=$(get np)
  for ms in ${GPU_CHECK_HOLDS:-1 5 20 100}; do
    n=$((n + 1))  # a value may come twice (interleaved repeats): one file per launch
    seconds=$(limit 100 10)
    if [ "$seconds" -lt 40 ]; then
      part holds "- np=$np, wait at most $ms ms: not run (the command's time budget is spent)"
      continue
    fi
    bench_launch holds "np=$np, wait at most $ms ms" "$np" "$seconds" COLLECTIVES_GPU_FUSION_WAIT_MS="$ms" -- \
      --sections fused,train --time-limit $((seconds - 30)) --json "$STATE/bench-hold-$n-$ms.json"
  done
}

# Sharded optimizer state (docs/zero.md): memory and step time over NCCL, one table.
stage_zero() {
  LOG_STAGE=bench
  : >"$STATE/part-zero.md"
  if [ "$(get gpus)" -lt 1 ] 2>/dev/null; then
    part zero "- not run: no GPU"
    return
  fi
  local seconds vars=()
  seconds=$(limit 360 10)
  if [ "$seconds" -lt 90 ]; then
    part zero "- not run (the command's time budget is spent)"
    return
  fi
  [ "$(get shared)" = 1 ] && vars+=(COLLECTIVES_TEST_SHARED_GPU=1)
  local t0=$SECONDS rc
  env ${vars[@]+"${vars[@]}"} timeout "$seconds" "$PY" benchmarks/zero_bench.py --device cuda --ranks 1 2 \
    --mpirun "$(get mpirun)" --timeout $(((seconds - 10) / 7)) >"$STATE/zero.log" 2>&1
  rc=$?
  if [ $rc = 0 ]; then
    part zero "$(grep -v '^# plot' "$STATE/zero.log")"
  else
    part zero "- zero_bench.py: FAILED (rc $rc, zero.log) [$((SECONDS - t0)) s]"
  fi
}

# ---------------------------------------------------------------- main

for stage in "${STAGES[@]}"; do
  case $stage in
    setup | tests | bench | extra | holds | zero) ;;
    *) echo "gpu-check: unknown stage '$stage' (setup, tests, bench, extra, holds, zero, all)" >&2; exit 2 ;;
  esac
done
rc=0
for stage in "${STAGES[@]}"; do
  if ! stage_setup; then
    rc=1
    break
  fi
  [ "$stage" = setup ] && continue
  "stage_$stage"
done
put finished "$(date -u +%Y-%m-%dT%H:%M:%SZ)"
report
"$PY" scripts/gpu_report.py "$STATE" "$REPORT" || rc=1
grep -q "FAILED" "$REPORT/gpu-check-report.md" 2>/dev/null && rc=1
exit $rc
