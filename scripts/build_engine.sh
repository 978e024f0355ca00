#!/usr/bin/env bash
# Rebuilds collectives._engine in place after a C++ change (after scripts/setup_env.sh made
# .venv). Safe to run from several shells at once: builds are serialized by a lock, and the
# new library replaces the old one by rename, so running processes keep the file they mapped.
set -euo pipefail
cd "$(dirname "$0")/.."
exec 9>"${TMPDIR:-/tmp}/collectives-build.lock"
flock 9
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
# COLLECTIVES_IN_TREE: the engine runs from the checkout, with .venv's libmpi (setup.py's runtime_library_dirs).
COLLECTIVES_IN_TREE=1 .venv/bin/python setup.py -q build_ext --build-lib "$out" --build-temp build/temp >/dev/null
so=$(cd "$out/collectives" && ls _engine*.so)
cp "$out/collectives/$so" "collectives/.$so.new"
mv -f "collectives/.$so.new" "collectives/$so"
echo "built collectives/$so"
