#!/usr/bin/env bash
# Builds the documentation site (docs/ and mkdocs.yml) into site/ with `mkdocs build --strict`:
# a broken link or anchor, a page missing from the nav, a docstring the API reference cannot
# read, any warning fails it. MkDocs and its plugins live in their own environment, .venv-docs
# (created once, refreshed when scripts/docs-requirements.txt changes), so the test environment
# keeps only what the tests need. Extra arguments go to `mkdocs build`.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
VENV=.venv-docs
REQUIREMENTS=scripts/docs-requirements.txt

if [ ! -x "$VENV/bin/python" ]; then
  if ! "$PYTHON" -c 'import ensurepip, venv' >/dev/null 2>&1; then  # Debian keeps venv apart
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
      echo "docs: installing python3-venv with apt-get"
      apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3-venv >/dev/null
    else
      echo "docs: please install python3-venv (e.g. sudo apt-get install python3-venv)" >&2
      exit 1
    fi
  fi
  "$PYTHON" -m venv "$VENV"
fi
if ! cmp -s "$REQUIREMENTS" "$VENV/installed-requirements.txt"; then
  "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check -r "$REQUIREMENTS"
  cp "$REQUIREMENTS" "$VENV/installed-requirements.txt"
fi

# The API reference reads the sources without importing them (griffe). The faces re-export
# collectives.adapters.*, which the source tree keeps in adapters/ and setup.py packages under
# collectives/: give griffe the installed layout as links (no copies, nothing compiled).
API_SRC=build/docs-api
rm -rf "$API_SRC"
mkdir -p "$API_SRC/collectives"
for entry in collectives/*; do
  case "$entry" in *.so|*/__pycache__) continue ;; esac
  ln -s "$PWD/$entry" "$API_SRC/collectives/"
done
ln -s "$PWD/adapters" "$API_SRC/collectives/adapters"

# The banner about MkDocs 2.0 and the theme's end of life is news, not a problem of these docs.
export NO_MKDOCS_2_WARNING=1
exec "$VENV/bin/mkdocs" build --strict --site-dir site "$@"
