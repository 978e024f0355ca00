"""The framework matrix: the face tests against the installed wheel, one fresh environment per cell.

    bash scripts/framework_matrix.sh                 every cell, then docs/compatibility.md
    bash scripts/framework_matrix.sh 3.10-oldest     only the cells named (the others keep their
                                                     last result in build/matrix/results.json)
    bash scripts/framework_matrix.sh --page          only rewrite the page from the stored results
    bash scripts/framework_matrix.sh --keep CELL     keep the cell's environment for a closer look

For each cell: the wheel for the cell's Python (scripts/build_wheel.sh with PYTHON=..., once per
Python and run), a fresh virtual environment with that wheel, its dependencies (mpich, mpi4py,
numpy), the cell's torch, tensorflow-cpu and tf-keras and pytest, all binary (--only-binary: nothing
compiles), then TESTS from a copy of tests/ and examples/ in which the checkout's collectives/ is
absent, so `import collectives` can only find the installed wheel (checked before the tests run).
The environment is removed after its cell: the CUDA builds of torch take 3-5 GB each.

Not the full cross product: every version of each axis runs at least once, the oldest with the
oldest and the newest with the newest. A cell whose versions pip does not serve for its Python
says so instead of failing. COLLECTIVES_MATRIX_WHEELHOUSE=folder adds a --find-links folder (wheels
fetched ahead with `pip download`).
"""
import argparse
import datetime
import fcntl
import glob
import json
import os
import re
import shutil
import subprocess
import sys
import time
from dataclasses import asdict, dataclass

import compatibility_page  # beside this script (its folder is first on sys.path)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
WORK = os.path.join(ROOT, "build", "matrix")
RESULTS = os.path.join(WORK, "results.json")
PAGE = os.path.join(ROOT, "docs", "compatibility.md")

# The face tests that cover the ops, the optimizer wrappers, Keras fit and its callbacks, Keras 2,
# and the three MNIST examples: about 10 mpirun launches, a few minutes a cell on 2 cores.
TESTS = [
    "tests/torch/test_torch_ops.py",
    "tests/torch/test_torch_optimizer.py",
    "tests/tensorflow/test_tensorflow_ops.py",
    "tests/tensorflow/test_tensorflow_training.py",
    "tests/tensorflow/test_keras2.py",
]
CELL_TIMEOUT = 3600  # seconds for one cell's tests (each test has its own mpirun timeouts too)


@dataclass
class Cell:
    name: str
    python: str
    torch: str
    tensorflow: str  # tensorflow-cpu's version (the TensorFlow build without CUDA libraries)
    tf_keras: str
    why: str


CELLS = [
    Cell("3.10-oldest", "3.10", "2.4.1", "2.16.2", "2.16.0", "the oldest of each axis"),
    Cell("3.11-pinned", "3.11", "2.13.0+cpu", "2.21.0", "2.21.0", "what scripts/setup_env.sh installs (torch's CPU build)"),
    Cell("3.12-middle", "3.12", "2.9.1", "2.18.1", "2.18.0", "the middle releases"),
    Cell("3.13-newest", "3.13", "2.14.1", "2.21.0", "2.21.0", "the newest of each axis that pip installs here"),
    Cell("3.13-oldest", "3.13", "2.4.1", "2.16.2", "2.16.0", "the oldest releases on the newest Python"),
]


def find_python(version):
    """An interpreter of ``version`` ("3.12"): pyenv's, else python3.12 on PATH, the first that
    runs (pyenv's shims for a version not selected are on PATH but fail)."""
    pyenv = os.environ.get("PYENV_ROOT", os.path.expanduser("~/.pyenv"))
    candidates = sorted(glob.glob(os.path.join(pyenv, "versions", f"{version}.*", "bin", "python")), reverse=True)
    for python in candidates + [shutil.which(f"python{version}")]:
        if python and subprocess.run([python, "-c", "pass"], capture_output=True).returncode == 0:
            return python
    return None


def run(cmd, log, timeout, **kwargs):
    """Runs ``cmd``, its output appended to ``log``; returns (returncode, output). A command past
    ``timeout`` is killed with its whole process group (mpirun's ranks too)."""
    with open(log, "a") as f:
        f.write(f"\n$ {' '.join(cmd)}\n")
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True, **kwargs)
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, 9)
        out, _ = proc.communicate()
        out += f"\n(killed after {timeout} s)\n"
        proc.returncode = 124
    with open(log, "a") as f:
        f.write(out)
    return proc.returncode, out


def build_wheel(python, log):
    """The wheel for ``python``, built into build/matrix/wheels/."""
    out_dir = os.path.join(WORK, "wheels")
    tag = "cp" + subprocess.check_output([python, "-c", "import sys; print('%d%d' % sys.version_info[:2])"],
                                         text=True).strip()
    env = dict(os.environ, PYTHON=python, WHEEL_DIR=out_dir)
    rc, out = run(["bash", os.path.join(ROOT, "scripts", "build_wheel.sh")], log, 3600, env=env, cwd=ROOT)
    found = glob.glob(os.path.join(out_dir, f"collectives-*-{tag}-*.whl"))
    if rc != 0 or len(found) != 1:
        raise RuntimeError(f"the wheel for {python} did not build (see {log}):\n{out[-2000:]}")
    return found[0]


def source_copy():
    """tests/ and examples/ copied to build/matrix/src-<pid>, beside no collectives/ package (one
    per run: two runs of different cells may go on at once)."""
    src = os.path.join(WORK, f"src-{os.getpid()}")
    shutil.rmtree(src, ignore_errors=True)
    for folder in ("tests", "examples"):
        shutil.copytree(os.path.join(ROOT, folder), os.path.join(src, folder),
                        ignore=shutil.ignore_patterns("__pycache__", ".pytest_cache"))
    return src


def requirements(cell):
    return [f"torch=={cell.torch}", f"tensorflow-cpu=={cell.tensorflow}", f"tf-keras=={cell.tf_keras}", "pytest>=7"]


NOT_SERVED = re.compile(r"No matching distribution found for ([^\s]+)")
FAILED = re.compile(r"^(FAILED|ERROR) (\S+)", re.M)
VERSIONS = ("import importlib.metadata as m, sys; print(' '.join(['python=%d.%d.%d' % sys.version_info[:3]] + "
            "[p + '=' + m.version(p) for p in ('torch', 'tensorflow-cpu', 'keras', 'tf-keras', 'numpy', "
            "'mpi4py', 'mpich')]))")
WHERE = "import collectives, os; print(os.path.realpath(collectives.__file__))"


def unserved(py, requirements, log):
    """The pinned requirements whose version pip's index lists no binary of for ``py``. pip's
    resolver says so in words only sometimes: with this machine's torch cap it reports a conflict
    with the constraint instead ("Cannot install torch==2.4.1 ... conflicting dependencies")."""
    missing = []
    for requirement in requirements:
        name, _, version = requirement.partition("==")
        if not version:
            continue
        _, out = run([py, "-m", "pip", "index", "versions", name, "--only-binary", ":all:"], log, 300)
        listed = re.search(r"Available versions: (.*)", out)
        if not listed or version not in [v.strip() for v in listed.group(1).split(",")]:
            missing.append(requirement)
    return missing


def install(cell, python, wheel, venv, log):
    """A fresh ``venv`` with ``wheel`` and the cell's frameworks; None, or (outcome, detail) when
    pip cannot install them."""
    run([python, "-m", "venv", venv], log, 300)
    pip = [os.path.join(venv, "bin", "python"), "-m", "pip", "install", "--disable-pip-version-check",
           "--only-binary", ":all:"]
    # A --find-links option replaces PIP_FIND_LINKS (where this machine keeps its torch +cpu
    # file), so both are given. From the wheelhouse alone first (no download twice), then
    # from the index when something is not in it.
    links = [a for link in os.environ.get("PIP_FIND_LINKS", "").split() for a in ("--find-links", link)]
    wheelhouse = os.path.join(os.environ.get("COLLECTIVES_MATRIX_WHEELHOUSE", "/nonexistent"), f"py{cell.python}")
    attempts = [["--no-index", "--find-links", wheelhouse]] if os.path.isdir(wheelhouse) else []
    for attempt in attempts + [[]]:
        rc, out = run(pip + links + attempt + [wheel] + requirements(cell), log, 3600)
        if rc == 0:
            return None
    missing = NOT_SERVED.findall(out) or unserved(os.path.join(venv, "bin", "python"), requirements(cell), log)
    if missing:
        return "not served", f"pip serves no {', '.join(missing)} for Python {cell.python}"
    return "fail", "pip install failed: " + out.strip().splitlines()[-1]


def run_cell(cell, wheels, src, logs, keep=False):
    """The result of one cell: a dict with its outcome ("pass", "fail", "not served", "skipped"),
    detail, installed versions and seconds."""
    start = time.time()
    log = os.path.join(logs, f"{cell.name}.log")
    open(log, "w").close()
    result = dict(asdict(cell), date=datetime.date.today().isoformat(), log=os.path.relpath(log, ROOT))

    def done(outcome, detail, **more):
        result.update(outcome=outcome, detail=detail, seconds=round(time.time() - start), **more)
        return result

    python = find_python(cell.python)
    if python is None:
        return done("skipped", f"no Python {cell.python} on this machine")
    if python not in wheels:
        wheels[python] = build_wheel(python, log)
    venv = os.path.join(WORK, "venv-" + cell.name)
    py = os.path.join(venv, "bin", "python")
    reuse = keep and os.path.exists(py)  # --keep: the environment an earlier --keep run left
    if not reuse:
        shutil.rmtree(venv, ignore_errors=True)
    try:
        if reuse:  # this run's wheel, in place of the one installed then
            run([py, "-m", "pip", "install", "--no-deps", "--force-reinstall", wheels[python]], log, 600)
        failed = None if reuse else install(cell, python, wheels[python], venv, log)
        if failed:
            return done(*failed)
        versions = subprocess.check_output([py, "-c", VERSIONS], text=True).split()
        env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH" and not k.startswith(("COLLECTIVES_", "VIRTUAL_ENV"))}
        env.update(PATH=os.path.join(venv, "bin") + os.pathsep + env.get("PATH", ""), PYTHONUNBUFFERED="1")
        where = subprocess.check_output([py, "-c", WHERE], text=True, cwd=src, env=env).strip()
        if not where.startswith(os.path.realpath(venv)):
            return done("fail", f"collectives was imported from {where}, not from the installed wheel")
        rc, out = run([py, "-m", "pytest", "-q", "-rfE", "-p", "no:cacheprovider", *TESTS], log, CELL_TIMEOUT,
                      cwd=src, env=env)
        failed = FAILED.findall(out)
        counts = (re.findall(r"^=*\s*(\d+ (?:passed|failed).*?) in [0-9.]+s", out, re.M) or [""])[-1]
        if rc == 0:
            return done("pass", counts, versions=versions)
        first = failed[0][1] if failed else f"pytest exit {rc}"
        return done("fail", f"first failure: {first} ({counts})", versions=versions)
    finally:
        if not keep:
            shutil.rmtree(venv, ignore_errors=True)


def load_results():
    if os.path.exists(RESULTS):
        with open(RESULTS) as f:
            return json.load(f)
    return {}


def save_result(result):
    """Adds one cell's result to build/matrix/results.json (read again under a lock: another run
    may have added its cells meanwhile); returns all results."""
    with open(RESULTS + ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        results = load_results()
        results[result["name"]] = result
        with open(RESULTS + ".tmp", "w") as f:
            json.dump(results, f, indent=1)
        os.replace(RESULTS + ".tmp", RESULTS)
    return results


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("cells", nargs="*", help="names of the cells to run (default: all)")
    parser.add_argument("--page", action="store_true", help="only write docs/compatibility.md from stored results")
    parser.add_argument("--keep", action="store_true", help="keep each cell's environment (build/matrix/venv-<cell>)")
    args = parser.parse_args()
    names = [c.name for c in CELLS]
    unknown = [n for n in args.cells if n not in names]
    if unknown:
        parser.error(f"unknown cells {unknown}; the cells are {names}")
    os.makedirs(os.path.join(WORK, "logs"), exist_ok=True)
    results = load_results()
    if not args.page:
        src = source_copy()
        wheels = {}
        for cell in CELLS:
            if args.cells and cell.name not in args.cells:
                continue
            load = os.getloadavg()[0]
            print(f"matrix: {cell.name}: Python {cell.python}, torch {cell.torch}, tensorflow-cpu {cell.tensorflow},"
                  f" tf-keras {cell.tf_keras} (load {load:.1f})", flush=True)
            try:
                result = run_cell(cell, wheels, src, os.path.join(WORK, "logs"), args.keep)
            except Exception as e:  # one broken cell must not lose the others' results
                result = dict(asdict(cell), outcome="fail", detail=f"{type(e).__name__}: {e}"[:500],
                              date=datetime.date.today().isoformat())
            result.update(load_before=round(load, 1), load_after=round(os.getloadavg()[0], 1),
                          command="bash scripts/framework_matrix.sh " + " ".join(sys.argv[1:]))
            print(f"matrix: {cell.name}: {result['outcome']}: {result['detail']} ({result.get('seconds', '?')} s)",
                  flush=True)
            results = save_result(result)
        shutil.rmtree(src, ignore_errors=True)
    compatibility_page.write(PAGE, CELLS, TESTS, load_results())
    print(f"matrix: wrote {os.path.relpath(PAGE, ROOT)}")
    if args.page:
        return 0
    results = load_results()
    return 0 if all(results.get(c.name, {}).get("outcome") in ("pass", "not served", "skipped") for c in CELLS) else 1


if __name__ == "__main__":
    sys.exit(main())
