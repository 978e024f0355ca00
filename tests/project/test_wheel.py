"""The binary wheel (scripts/build_wheel.sh) installs with pip into a fresh virtual environment
on a PATH with no compiler, and runs there: a 2-rank allreduce, the torch face and the Keras face.

The wheel is built once (or taken from dist/ when newer than the sources); it reuses the engine
objects the editable install compiled, so it costs a link. The frameworks are not installed into
the fresh environment again (2.5 GB, about a minute): a .pth file adds the site-packages they lie
in to its path, after its own, and only for the frameworks test, so the engine test sees nothing
but what pip installed from the wheel's dependencies. COLLECTIVES_WHEEL_FRAMEWORKS=install makes
it install them with pip instead.
"""
import glob
import importlib.util
import os
import shutil
import signal
import subprocess
import sys
import time
import zipfile

import pytest

from mpi_launch import SUPPORT, Run, assert_all_ranks_passed, worker_path

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
FRAMEWORKS = ["torch==2.13.0+cpu", "tensorflow-cpu==2.21.0"]  # as scripts/setup_env.sh pins them
COMPILERS = ["cc", "gcc", "g++", "c++", "clang", "clang++", "x86_64-linux-gnu-gcc", "x86_64-linux-gnu-g++"]


def newest_source_mtime():
    paths = [os.path.join(ROOT, f) for f in ("setup.py", "pyproject.toml", "scripts/build_wheel.sh")]
    for top in ("csrc", "collectives", "adapters"):
        for folder, dirs, files in os.walk(os.path.join(ROOT, top)):
            dirs[:] = [d for d in dirs if d != "__pycache__"]
            paths += [os.path.join(folder, f) for f in files if not f.endswith((".so", ".pyc"))]
    return max(os.path.getmtime(p) for p in paths)


def the_wheel():
    """dist/'s wheel when it is newer than every source, else a new one from scripts/build_wheel.sh."""
    found = glob.glob(os.path.join(ROOT, "dist", "collectives-*.whl"))
    if len(found) == 1 and os.path.getmtime(found[0]) > newest_source_mtime():
        return found[0]
    proc = subprocess.run(["bash", os.path.join(ROOT, "scripts", "build_wheel.sh")], capture_output=True,
                          text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    found = glob.glob(os.path.join(ROOT, "dist", "collectives-*.whl"))
    assert len(found) == 1, found
    return found[0]


def no_compiler_env(venv):
    """An environment with the venv's bin alone on PATH (no compiler, no system tools), CC and CXX
    that fail, and what pip needs to reach the machine's package index."""
    env = {k: v for k, v in os.environ.items()
           if k.startswith(("PIP_", "LANG", "LC_")) or k.lower() in ("home", "tmpdir", "http_proxy", "https_proxy",
                                                                     "no_proxy", "ssl_cert_file")}
    env.update(PATH=os.path.join(venv, "bin"), CC="/bin/false", CXX="/bin/false", PYTHONUNBUFFERED="1",
               OMP_NUM_THREADS="1", PYTHONPATH=SUPPORT)
    return env


def run(what, cmd, env, timeout, cwd):
    """Runs ``cmd``, which must succeed within ``timeout`` (else its whole process group is
    killed: mpirun's ranks too); prints how long ``what`` took (pytest -s shows it)."""
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=cwd,
                            start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        raise AssertionError(f"{what}: {cmd} timed out after {timeout} s (killed)\n{out}\n{err}")
    assert proc.returncode == 0, f"{what}: {cmd} failed: {proc.returncode}\n{out}\n{err}"
    print(f"\n{what}: {time.perf_counter() - start:.1f} s")
    return Run(proc.returncode, out, err)


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    """(wheel, venv, env, workdir): the wheel installed by pip into a fresh virtual environment."""
    wheel = the_wheel()
    work = tmp_path_factory.mktemp("wheel")
    venv = str(work / "venv")
    env = no_compiler_env(venv)
    run("a fresh virtual environment", [sys.executable, "-m", "venv", venv], env, 120, str(work))
    py = os.path.join(venv, "bin", "python")
    # --only-binary: nothing may be compiled here, the wheel's dependencies included.
    run("pip install of the wheel and its dependencies",
        [py, "-m", "pip", "install", "--quiet", "--only-binary", ":all:", wheel], env, 600, str(work))
    return wheel, venv, env, str(work)


def engine_path(venv):
    found = glob.glob(os.path.join(venv, "lib", "python*", "site-packages", "collectives", "_engine*.so"))
    assert len(found) == 1, found
    return found[0]


def two_ranks(venv, what):
    """wheel_worker.py ``what`` under the venv's mpirun (the mpich wheel's) on 2 ranks."""
    return [os.path.join(venv, "bin", "mpirun"), "-np", "2", os.path.join(venv, "bin", "python"),
            worker_path("wheel_worker.py"), what]


def test_the_wheel_carries_no_mpi_and_no_build_path(installed):
    wheel, venv, env, work = installed
    with zipfile.ZipFile(wheel) as whl:
        bundled = [n for n in whl.namelist() if "libmpi" in n or ".libs/" in n]
    assert bundled == [], f"the wheel bundles {bundled}: MPICH must come from the mpich wheel"
    readelf = shutil.which("readelf")
    if readelf is None:
        pytest.skip("no readelf (binutils) to read the engine's RUNPATH")
    dynamic = subprocess.run([readelf, "-d", engine_path(venv)], capture_output=True, text=True, check=True,
                             timeout=60).stdout
    runpaths = [line.split("[", 1)[1].rstrip("]").split(":") for line in dynamic.splitlines()
                if "(RUNPATH)" in line or "(RPATH)" in line]
    assert runpaths and all(p.startswith("$ORIGIN") for paths in runpaths for p in paths), dynamic
    assert "[libmpi.so.12]" in dynamic, dynamic


def test_no_compiler_and_the_engine_finds_the_mpich_wheel_alone(installed):
    """The engine's RUNPATH finds the mpich wheel's libmpi with no mpi4py loaded first."""
    _, venv, env, work = installed
    probe = ("import ctypes, shutil, sys\n"
             f"found = [c for c in {COMPILERS!r} if shutil.which(c)]\n"
             "assert not found, f'compilers on PATH: {found}'\n"
             f"ctypes.CDLL({engine_path(venv)!r})\n"
             "assert 'mpi4py' not in sys.modules\n"
             "print(sorted({l.split()[-1] for l in open('/proc/self/maps') if '/libmpi' in l}))\n")
    out = run("the engine loaded alone", [os.path.join(venv, "bin", "python"), "-c", probe], env, 60, work).stdout
    assert out.strip() == repr([os.path.join(venv, "lib", "libmpi.so.12")]), out


def test_two_ranks_allreduce_from_the_wheel(installed):
    _, venv, env, work = installed
    proc = run("2-rank allreduce", two_ranks(venv, "engine"), env, 120, work)
    assert_all_ranks_passed(proc, 2, min_cases=2)


def test_torch_and_keras_faces_from_the_wheel(installed):
    # Found, not imported: this process need not load them.
    specs = [importlib.util.find_spec(name) for name in ("torch", "tensorflow")]
    if None in specs:
        pytest.skip("needs torch and tensorflow")
    _, venv, env, work = installed
    if os.environ.get("COLLECTIVES_WHEEL_FRAMEWORKS") == "install":
        run("pip install of the frameworks", [os.path.join(venv, "bin", "python"), "-m", "pip", "install", "--quiet",
                                              "--only-binary", ":all:", *FRAMEWORKS], env, 900, work)
    else:
        site_packages = {os.path.dirname(os.path.dirname(spec.origin)) for spec in specs}
        own = glob.glob(os.path.join(venv, "lib", "python*", "site-packages"))[0]
        with open(os.path.join(own, "zz_frameworks.pth"), "w") as f:
            f.write("".join(p + "\n" for p in sorted(site_packages)))
    proc = run("2-rank torch and Keras faces", two_ranks(venv, "frameworks"), env, 240, work)
    assert_all_ranks_passed(proc, 2, min_cases=3)
