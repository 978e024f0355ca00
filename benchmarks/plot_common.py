"""Shared parts of the plot drivers (benchmarks/plot_bandwidth.py, benchmarks/plot_training.py):
launching a worker under a virtual environment's mpirun with a hard timeout, and writing a PNG
whose caption says where and when the figures were measured.

The drivers themselves run without mpirun: they start one mpirun per round, so a round that
hangs is killed as a whole process group instead of stalling the plot.
"""
import json
import os
import signal
import subprocess
import sys
import tempfile

from machine_info import describe_load, describe_machine, utc_now

HERE = os.path.dirname(os.path.abspath(__file__))


def venv_of_this_python():
    """The environment this driver runs in (its python and mpirun are beside each other)."""
    return os.path.dirname(os.path.dirname(os.path.abspath(sys.executable)))


def run_mpi_worker(venv, np, script, args, timeout, env=None, mpirun=None):
    """Runs ``venv/bin/mpirun -np NP venv/bin/python script args... --json FILE`` and returns the
    JSON the worker wrote (rank 0). Raises RuntimeError, with the worker's output, on failure.
    ``mpirun``: another MPI launcher (a GPU machine's, where the Python is no virtual environment)."""
    python = os.path.join(venv, "bin", "python") if mpirun is None else sys.executable
    mpirun = mpirun or os.path.join(venv, "bin", "mpirun")
    for path in (python, mpirun):
        if not os.access(path, os.X_OK):
            raise RuntimeError(f"no executable {path}: is {venv} a virtual environment with MPICH?")
    full_env = dict(os.environ)
    # One compute thread per rank: the ranks share the machine's cores with each other.
    full_env.update({"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1",
                     "VIRTUAL_ENV": venv, "PATH": os.path.join(venv, "bin") + os.pathsep + full_env.get("PATH", "")})
    full_env.update(env or {})
    with tempfile.TemporaryDirectory(prefix="bench-plot-") as tmp:
        out_json = os.path.join(tmp, "result.json")
        cmd = [mpirun, "-np", str(np), python, script, *map(str, args), "--json", out_json]
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=full_env,
                                start_new_session=True)
        try:
            out, _ = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            out, _ = proc.communicate()
            raise RuntimeError(f"{' '.join(cmd)} timed out after {timeout} s (killed):\n{out}")
        if proc.returncode != 0 or not os.path.exists(out_json):
            raise RuntimeError(f"{' '.join(cmd)} failed (exit code {proc.returncode}):\n{out}")
        with open(out_json) as f:
            return json.load(f)


def caption_lines(loads_before, loads_after, extra, measured=None):
    """The lines under a figure: machine, date measured (default: now), load before and after the
    run, method."""
    return [f"{describe_machine()}; measured {measured or utc_now()}",
            f"before the run: {describe_load(loads_before)}; after: {describe_load(loads_after)}",
            *extra]


def save_figure(fig, path, captions):
    """Writes ``fig`` to ``path`` (PNG) with ``captions`` in small type along its bottom edge."""
    fig.text(0.01, 0.01, "\n".join(captions), fontsize=7, va="bottom", ha="left", family="monospace")
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    fig.savefig(path, dpi=90)


def import_pyplot():
    """matplotlib's pyplot on the file-only backend, or SystemExit saying how to install it."""
    try:
        import matplotlib
    except ImportError:
        raise SystemExit("matplotlib is missing: bash scripts/setup_env.sh bench "
                         "(or .venv/bin/pip install matplotlib)")
    matplotlib.use("Agg")  # no display here; PNG only
    import matplotlib.pyplot as plt

    return plt
