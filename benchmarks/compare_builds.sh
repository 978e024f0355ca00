#!/usr/bin/env bash
# Runs the peer kit's benchmark (../shared/peer/peer_bench.py) for two builds of collectives, interleaved
# (before, after, before, after ...), then prints benchmarks/compare_builds.py's table.
#   usage: bash benchmarks/compare_builds.sh BEFORE_VENV AFTER_VENV [ROUNDS]   (ROUNDS defaults to 3)
#   env:   KIT (default ../shared/peer), OUT (default /tmp/compare-builds/DATE), NP=2, REPS_SCALE=1.0
set -euo pipefail
before=$1 after=$2 rounds=${3:-3}
here=$(cd "$(dirname "$0")" && pwd)
KIT=$(cd "${KIT:-$here/../../shared/peer}" && pwd)
OUT=${OUT:-/tmp/compare-builds/$(date +%Y%m%d-%H%M%S)}
mkdir -p "$OUT"
for v in "$before" "$after"; do
  [ -x "$v/bin/python" ] && [ -x "$v/bin/mpirun" ] || { echo "no venv with python and mpirun: $v"; exit 1; }
done
unset HOROVOD_CYCLE_TIME HOROVOD_FUSION_THRESHOLD HOROVOD_CACHE_CAPACITY HOROVOD_TIMELINE HOROVOD_AUTOTUNE
for v in $(env | grep -o '^COLLECTIVES_[A-Z0-9_]*' || true); do unset "$v"; done
export OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 PYTHONUNBUFFERED=1
for r in $(seq 1 "$rounds"); do
  for build in before after; do
    if [ $build = before ]; then v=$before; else v=$after; fi
    ts=$(date +%s)
    # from / so that neither build's checkout shadows the other's installed package
    (cd / && PATH="$v/bin:$PATH" VIRTUAL_ENV="$v" "$v/bin/mpirun" -np "${NP:-2}" "$v/bin/python" "$KIT/peer_bench.py" \
       --impl collectives --out "$OUT/$build.$r.json" --reps-scale "${REPS_SCALE:-1.0}") > "$OUT/$build.$r.log" 2>&1 \
      || { echo "round $r $build FAILED:"; tail -15 "$OUT/$build.$r.log"; exit 1; }
    echo "round $r/$rounds $build: $(( $(date +%s) - ts )) s"
  done
done
"$before/bin/python" "$here/compare_builds.py" --kit "$KIT" "$OUT" | tee "$OUT/table.txt"
