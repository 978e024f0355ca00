"""Writes docs/compatibility.md from the framework matrix's results (scripts/framework_matrix.py).

The supported range on the page comes from SUPPORTED, which pyproject.toml's optional extras must
match (tests/project/test_compatibility_page.py checks both, and that every cell has a result).
"""
import os

# The oldest releases the matrix ran (and passed); no upper bound: the engine compiles against no
# framework, so a new framework release needs no new build of ours.
SUPPORTED = {"torch": "torch>=2.4", "tensorflow": "tensorflow>=2.16", "keras": "tf-keras>=2.16"}
RANGE_LINE = ("Supported: Python 3.10-3.13, PyTorch 2.4 and newer (tested up to 2.14.1), TensorFlow 2.16 and "
              "newer with Keras 3 or tf-keras (Keras 2), tested up to 2.21; see docs/compatibility.md.")

# What the runs showed beyond pass/fail (kept by hand: each line was seen in a run's log).
FINDINGS = [
    "What pip serves (2026-11): for Python 3.13, torch from 2.5 and tensorflow(-cpu) from 2.20 only; for "
    "Python 3.12, torch from 2.2 and TensorFlow from 2.16; torch 2.15.0 exists but this machine's pip is capped at "
    "2.14.1.",
    "torch 2.4's `mse_loss` has no bfloat16 kernel on the CPU: a test of bfloat16 parameters used it (the library "
    "does not); the test now spells the loss out.",
    "torch's CUDA builds install `nvidia-nccl-cu12`, so `nccl_built()` reports that NCCL's version (22005 for "
    "2.20.5 beside torch 2.4) on a machine with no GPU too, as the engine finds and loads it; with torch's CPU build it "
    "is 0. A test assumed 0.",
    "`tensorflow-cpu` 2.16.2 on Linux installs `tensorflow` 2.16.2 beside it, and keeps numpy below 2 (1.26.4).",
    "tf-keras 2.18.0 on Python 3.12 and newer: after `tf_keras.utils.set_random_seed`, building any layer raises "
    "`TypeError: 'float' object cannot be interpreted as an integer` (its seed generator calls "
    "`random.randint(1, 1e9)`); tf_keras's bug, not ours. The Keras 2 tests seed Python's, numpy's and "
    "TensorFlow's generators themselves instead (tests/tensorflow/workers/keras_training.py); a user of tf-keras "
    "2.18 on Python 3.12 meets it in their own script: take tf-keras 2.19 or newer, or seed as the tests do.",
    "With TensorFlow 2.16 the Keras 2 test's one launch of 30-odd cases took 280-330 s on the busy 2-core machine; "
    "its limit is now 600 s.",
]

OUTCOME = {"pass": "pass", "fail": "**fail**", "not served": "not served", "skipped": "skipped"}


def versions_cell(result, package):
    for item in result.get("versions", []):
        name, _, version = item.partition("=")
        if name == package:
            return version
    return ""


def write(path, cells, tests, results):
    ran = [results[c.name] for c in cells if c.name in results]
    dates = sorted({r["date"] for r in ran})
    lines = [
        "# Framework compatibility",
        "",
        RANGE_LINE,
        "",
        "The engine is compiled against no framework (the faces reach torch and TensorFlow through",
        "their Python APIs and DLPack), so one wheel per Python serves every framework release.",
        "This table shows which releases were tested, by `bash scripts/framework_matrix.sh`: for each",
        "cell it builds the wheel for the cell's Python, installs it with the cell's frameworks into a",
        "fresh virtual environment (binaries only) and runs the face tests below against the installed",
        "wheel, from a copy of `tests/` beside no `collectives/` source folder.",
        "",
        f"Run on {', '.join(dates) if dates else '(not yet run)'}, on a 2-core Linux x86_64 machine shared with "
        "other jobs (load average in the table: before and after the cell).",
        "",
        "Not the full cross product: every version of each axis runs at least once, the oldest with the oldest",
        "and the newest with the newest. torch 2.13.0+cpu is the CPU build (its file is on this machine for",
        "Python 3.11 only); the other torch versions are PyPI's CUDA builds, which run on the CPU too.",
        "TensorFlow is `tensorflow-cpu`; Keras 3 is whatever pip resolves beside it.",
        "",
        "| cell | Python | torch | tensorflow-cpu | keras | tf-keras | numpy | result | seconds | load | why this cell |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for cell in cells:
        r = results.get(cell.name)
        if r is None:
            lines.append(f"| {cell.name} | {cell.python} | {cell.torch} | {cell.tensorflow} | | {cell.tf_keras} | | "
                         f"not run yet | | | {cell.why} |")
            continue
        python = versions_cell(r, "python") or cell.python
        result = f"{OUTCOME[r['outcome']]}: {r['detail']}" if r.get("detail") else OUTCOME[r["outcome"]]
        lines.append(f"| {cell.name} | {python} | {versions_cell(r, 'torch') or cell.torch} | "
                     f"{versions_cell(r, 'tensorflow-cpu') or cell.tensorflow} | {versions_cell(r, 'keras')} | "
                     f"{versions_cell(r, 'tf-keras') or cell.tf_keras} | {versions_cell(r, 'numpy')} | "
                     f"{result.replace('|', '/')} | {r.get('seconds', '')} | "
                     f"{r.get('load_before', '')} / {r.get('load_after', '')} | {cell.why} |")
    lines += ["", "## What the matrix found", "", *[f"- {finding}" for finding in FINDINGS]]
    commands = sorted({r.get("command", "").strip() for r in ran} - {""})
    lines += [
        "",
        "Commands: " + ("; ".join(f"`{c}`" for c in commands) if commands else "`bash scripts/framework_matrix.sh`")
        + " (one cell at a time: `bash scripts/framework_matrix.sh <cell>`; the page alone: `--page`; `--keep` keeps a"
        " cell's environment, and a later `--keep` run tests in it again with that run's wheel). Most wheels came from"
        " a folder filled ahead with `pip download` (`COLLECTIVES_MATRIX_WHEELHOUSE`), the files pip would fetch.",
        "",
        "The tests each cell runs (the ops, the optimizer wrappers, Keras `fit` and its callbacks, Keras 2",
        "through tf-keras, and the three MNIST examples):",
        "",
        *[f"- `{t}`" for t in tests],
        "",
        "The optional extras in `pyproject.toml` state the same range: "
        + ", ".join(f"`{k} = [\"{v}\"]`" for k, v in SUPPORTED.items()) + ".",
        "",
    ]
    with open(path, "w") as f:
        f.write("\n".join(lines))
