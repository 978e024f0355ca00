"""The engine's sources in folders by concern (docs/architecture.md), and the directions in which
those folders may include each other: read from the `#include "..."` lines, no compiler involved.

A folder may include its own files and those of the folders ALLOWED lists for it. The layers, lowest
first: common; host_math, monitor, wait, gpu; backends/mpi; shm, operation; backends/nccl, algorithms,
negotiation; execution; core; and the engine's callers (frontend, python, tensorflow), which alone
include the engine's public header, core/engine.h.
"""
import os
import re

CSRC = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "csrc")

ALLOWED = {
    "common": set(),
    "host_math": {"common"},
    "monitor": {"common"},
    "wait": {"common"},
    "gpu": {"common"},
    "backends/mpi": {"common", "host_math", "wait"},
    "shm": {"common", "wait", "backends/mpi"},
    "operation": {"common", "wait"},
    "backends/nccl": {"common", "host_math", "gpu", "operation"},
    "algorithms": {"common", "host_math", "wait", "shm", "backends/mpi", "operation"},
    "negotiation": {"common", "host_math", "monitor", "wait", "shm", "backends/mpi", "operation"},
    "execution": {"common", "host_math", "monitor", "wait", "shm", "backends/mpi", "backends/nccl", "gpu",
                  "algorithms", "operation", "negotiation"},
    # The engine reaches GPUs through execution only.
    "core": {"common", "host_math", "monitor", "wait", "shm", "backends/mpi", "algorithms", "operation",
             "negotiation", "execution"},
    "frontend": {"common", "core"},
    "tensorflow": {"common", "core", "frontend"},
    "python": {"common", "host_math", "gpu", "core", "frontend", "tensorflow"},
}
PUBLIC_HEADER = "core/engine.h"
MAY_INCLUDE_PUBLIC_HEADER = {"core", "frontend", "python", "tensorflow"}
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)
GENERATED = {"gpu_kernels_ptx.inc"}  # setup.py writes it into the build folder


def engine_files():
    """(folder, path relative to csrc) of every file under csrc/."""
    for root, _, names in os.walk(CSRC):
        for name in names:
            rel = os.path.relpath(os.path.join(root, name), CSRC)
            yield os.path.dirname(rel), rel


def includes(rel):
    with open(os.path.join(CSRC, rel)) as f:
        return INCLUDE.findall(f.read())


FILES = sorted(engine_files())


def test_every_file_is_in_a_known_folder():
    misplaced = [rel for folder, rel in FILES if folder not in ALLOWED]
    assert not misplaced, f"files outside the folders of ALLOWED (add the folder and its rules): {misplaced}"
    assert all(os.path.isdir(os.path.join(CSRC, folder)) for folder in ALLOWED), "a folder of ALLOWED is gone"


def test_includes_name_existing_files_by_their_path_from_csrc():
    wrong = [f"{rel}: {name}" for _, rel in FILES for name in includes(rel)
             if name not in GENERATED and not os.path.isfile(os.path.join(CSRC, name))]
    assert not wrong, "includes that are no path from csrc/ to a file: " + "; ".join(wrong)


def test_folders_include_only_what_they_may():
    wrong = []
    for folder, rel in FILES:
        for name in includes(rel):
            target = os.path.dirname(name)
            if name not in GENERATED and target != folder and target not in ALLOWED[folder]:
                wrong.append(f"{rel} includes {name} ({folder} may include {sorted(ALLOWED[folder]) or 'nothing'})")
    assert not wrong, "\n".join(wrong)


def test_only_the_engines_callers_include_its_public_header():
    wrong = [rel for folder, rel in FILES if folder not in MAY_INCLUDE_PUBLIC_HEADER and PUBLIC_HEADER in includes(rel)]
    assert not wrong, f"{PUBLIC_HEADER} included outside {sorted(MAY_INCLUDE_PUBLIC_HEADER)}: {wrong}"


def test_no_header_of_the_core_includes_a_gpu_header():
    wrong = [f"{rel}: {name}" for folder, rel in FILES if rel.endswith(".h")
             and folder in ("common", "operation", "negotiation", "core") for name in includes(rel)
             if name.startswith(("gpu/", "backends/nccl/"))]
    assert not wrong, wrong


def test_the_rules_follow_the_layers():
    # No cycle between folders: each may include only folders that come before it in ALLOWED.
    order = list(ALLOWED)
    late = {f: sorted(a for a in allowed if order.index(a) >= order.index(f)) for f, allowed in ALLOWED.items()}
    assert not any(late.values()), late

