"""The engine's shared object exports its module init alone (csrc/python/engine_exports.map).

On a GPU machine (Ubuntu 24.04, GCC 13) the toolchain linked libstdc++ into the engine
statically and exported its symbols, among them the locale facets' ids as GNU unique symbols.
The dynamic linker bound those to the ids of the process's own libstdc++.so.6 (another GCC
release, loaded by numpy), so the engine's copy looked facets up at the other copy's indices:
the first number written to an error message called a codecvt facet instead of num_put and
crashed the engine thread. With nothing but PyInit__engine exported, whatever C++ runtime the
engine carries stays private to it.
"""
import shutil
import subprocess

import pytest

from collectives._loader import engine_module


def defined_dynamic_symbols(path):
    nm = shutil.which("nm")
    if nm is None:
        pytest.skip("no nm (binutils) to read the engine's dynamic symbol table")
    out = subprocess.run([nm, "-D", "--defined-only", path], capture_output=True, text=True, check=True,
                         timeout=60).stdout
    return [line.split()[-1] for line in out.splitlines() if line.strip()]


def test_the_engine_exports_only_its_module_init():
    path = engine_module().__file__
    symbols = defined_dynamic_symbols(path)
    assert symbols == ["PyInit__engine"], (
        f"{path} exports {len(symbols)} symbols, e.g. {symbols[:8]}: the linker did not apply "
        "csrc/python/engine_exports.map (setup.py's --version-script)")
