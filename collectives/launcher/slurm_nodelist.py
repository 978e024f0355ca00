"""Slurm's compressed lists, expanded as Slurm expands them.

Node lists (``SLURM_JOB_NODELIST``): ``node[01-04,07]`` -> node01 node02 node03 node04 node07;
``a[1-2],b3`` -> a1 a2 b3; several bracket groups multiply (``a[1-2]b[3-4]`` -> a1b3 a1b4 a2b3 a2b4);
a range is zero-padded to the width of its lower bound as written (``n[01-3]`` -> n01 n02 n03,
``n[1-02]`` -> n1 n2); commas inside brackets do not split the list; an empty entry is skipped.
What ``scontrol show hostnames`` (Slurm 22.05) calls an invalid host list (a range going down, a
letter range, text after the last bracket) raises SlurmListError here.

Task counts (``SLURM_TASKS_PER_NODE``): ``2(x3),1`` -> 2 2 2 1.

``hostnames()`` asks Slurm's own ``scontrol show hostnames`` when it is installed (the reference
behaviour) and falls back to this parser when it is not or cannot run (no slurm.conf on this
machine); tests/launcher/test_slurm_nodelist.py holds the two to the same answers.
"""
import re
import shutil
import subprocess
from typing import List, Optional

SCONTROL_TIMEOUT_S = 10
_TASKS = re.compile(r"^(\d+)(?:\(x(\d+)\))?$")


class SlurmListError(ValueError):
    """A node list or task count Slurm would not produce; the message is one line."""


def _split_top(text) -> List[str]:
    """Split at commas outside brackets."""
    parts, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        if ch == "[":
            depth += 1
            if depth > 1:
                raise SlurmListError(f"node list {text!r}: nested brackets")
        elif ch == "]":
            depth -= 1
            if depth < 0:
                raise SlurmListError(f"node list {text!r}: ']' without '['")
        elif ch == "," and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    if depth:
        raise SlurmListError(f"node list {text!r}: '[' without ']'")
    parts.append(text[start:])
    return [p.strip() for p in parts if p.strip()]


def _range_values(body, whole) -> List[str]:
    """'01-04,07' -> ['01', '02', '03', '04', '07']"""
    values = []
    for piece in body.split(","):
        lo, sep, hi = piece.strip().partition("-")
        if not lo.isdigit() or (sep and not hi.isdigit()):
            raise SlurmListError(f"node list {whole!r}: invalid range {piece!r}")
        if not sep:
            values.append(lo)
            continue
        first, last = int(lo), int(hi)
        if last < first:
            raise SlurmListError(f"node list {whole!r}: invalid range {piece!r} (goes down)")
        width = len(lo)
        values.extend(str(n).zfill(width) for n in range(first, last + 1))
    return values


def _expand_entry(entry, whole) -> List[str]:
    """'a[1-2]b[3-4]' -> a1b3 a1b4 a2b3 a2b4; text after the last bracket is invalid (as in Slurm)."""
    names = [""]
    rest = entry
    while "[" in rest:
        prefix, _, tail = rest.partition("[")
        body, _, rest = tail.partition("]")
        names = [n + prefix + v for n in names for v in _range_values(body, whole)]
    if rest and "[" in entry:
        raise SlurmListError(f"node list {whole!r}: text {rest!r} after a bracketed range")
    return [n + rest for n in names]


def expand_nodelist(text) -> List[str]:
    """Every host name of a Slurm node list, in Slurm's order."""
    names = []
    for entry in _split_top(text):
        names.extend(_expand_entry(entry, text))
    return names


def expand_tasks(text) -> List[int]:
    """``SLURM_TASKS_PER_NODE``: '2(x3),1' -> [2, 2, 2, 1]."""
    counts = []
    for piece in text.split(","):
        m = _TASKS.match(piece.strip())
        if not m:
            raise SlurmListError(f"task counts {text!r}: cannot read {piece!r} (expected N or N(xK))")
        counts.extend([int(m.group(1))] * int(m.group(2) or 1))
    return counts


def scontrol_hostnames(text, environ=None) -> Optional[List[str]]:
    """``scontrol show hostnames TEXT``; None when scontrol is missing or cannot run here
    (it needs a slurm.conf), SlurmListError when it calls the list invalid."""
    path = shutil.which("scontrol", path=(environ or {}).get("PATH"))
    if path is None:
        return None
    try:
        proc = subprocess.run([path, "show", "hostnames", text], capture_output=True, text=True,
                              timeout=SCONTROL_TIMEOUT_S, stdin=subprocess.DEVNULL, env=environ)
    except (subprocess.TimeoutExpired, OSError):
        return None
    out = proc.stdout.splitlines()
    # scontrol (22.05) exits 0 and prints this line on stderr for a list it cannot parse.
    if any(line.startswith("Invalid hostlist") for line in out + proc.stderr.splitlines()):
        raise SlurmListError(f"node list {text!r}: scontrol show hostnames calls it invalid")
    if proc.returncode != 0 or "fatal" in proc.stderr:
        return None
    return [line.strip() for line in out if line.strip()]


def hostnames(text, environ=None) -> List[str]:
    """The node list expanded by Slurm's scontrol when it can run, else by our parser."""
    found = scontrol_hostnames(text, environ)
    return found if found is not None else expand_nodelist(text)
