#!/usr/bin/env bash
# When scripts/gpu-check.sh reports a crash on a GPU machine: runs launches again with Python's
# fault handler (the Python stacks at a fault) and under cuda-gdb (the native stacks; the GPU
# image has no gdb), after the facts of the engine's build, all into one log: $OUT/diag.log
# (else ./gpu-diag/diag.log), with a copy of the engine's shared object beside it.
#
#   bash scripts/gpu_diagnose.sh ["NP SCRIPT ARGS..." ...]
#
# Each case is a quoted "ranks, script, arguments" (scripts relative to the repository; set
# variables before the ranks: "COLLECTIVES_TEST_SHARED_GPU=1 2 scripts/gpu_bench.py --probe").
# Without cases: the launches that crashed on the first GPU run (docs/gpus.md).
# GDB_BIN=gdb rehearses it on a machine without cuda-gdb.
set -u
cd "$(dirname "$0")/.."
REPORT=${OUT:-$PWD/gpu-diag}
mkdir -p "$REPORT"
LOG=$REPORT/diag.log
: >"$LOG"
GPU_CHECK_BUDGET_S=200 bash scripts/gpu-check.sh --report "$REPORT/setup" setup >>"$LOG" 2>&1
state() { grep "^$1=" build/gpu-check/state | tail -1 | cut -d= -f2-; }
PY=$(state python)
MPIRUN=$(state mpirun)
export PYTHONUNBUFFERED=1 OMP_NUM_THREADS=1 PYTHONPATH=$PWD/tests/support  # the workers' shared modules
SO=$(ls collectives/_engine*.so 2>/dev/null | head -1)
{
  echo "--- python $PY, mpirun $MPIRUN, CXX=${CXX:-} LD_LIBRARY_PATH=${LD_LIBRARY_PATH:-}"
  "${CXX:-g++}" --version | head -1
  ls -la "$SO"
  readelf -d "$SO" | grep -E "NEEDED|RUNPATH"
  echo "defined dynamic symbols: $(nm -D --defined-only "$SO" | wc -l)"
  ldconfig -p | grep -E "libcuda\.so|libnccl|libstdc\+\+" | head
} >>"$LOG" 2>&1
cp "$SO" "$REPORT/engine.so" 2>/dev/null

CASES=("$@")
[ ${#CASES[@]} -gt 0 ] || CASES=(
  "COLLECTIVES_NCCL_LIBRARY=/nonexistent/libnccl.so.2 1 tests/gpu/workers/gpu_fake_worker.py nolibs"
  "2 tests/engine/workers/errors_worker.py local"
  "COLLECTIVES_TEST_SHARED_GPU=1 2 scripts/gpu_bench.py --probe")
GDB=("${GDB_BIN:-cuda-gdb}" -q -batch -ex "set pagination off" -ex "set print thread-events off" -ex run
     -ex "p \$_siginfo._sifields._sigfault.si_addr" -ex "x/4i \$pc" -ex "info threads" -ex "thread apply all bt 25" --args)
run_case() {  # label, seconds, under the debugger (0/1), the case
  local label=$1 seconds=$2 under_gdb=$3 words vars=() wrap=()
  read -r -a words <<<"$4"
  while [[ ${words[0]} == *=* ]]; do
    vars+=("${words[0]}")
    words=("${words[@]:1}")
  done
  [ "$under_gdb" = 1 ] && wrap=("${GDB[@]}")
  echo "===== $label" >>"$LOG"
  local t0=$SECONDS
  timeout "$seconds" env ${vars[@]+"${vars[@]}"} PYTHONFAULTHANDLER=1 "$MPIRUN" -np "${words[0]}" \
    ${wrap[@]+"${wrap[@]}"} "$PY" "${words[@]:1}" >>"$LOG" 2>&1
  echo "===== $label: rc=$? in $((SECONDS - t0)) s" | tee -a "$LOG"
}
for c in "${CASES[@]}"; do
  run_case "$c" 90 0 "$c"
  run_case "$c, under ${GDB_BIN:-cuda-gdb}" 150 1 "$c"
done
