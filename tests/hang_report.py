"""What the processes of a timed-out run were doing, for the failure message.

A run that exceeds its timeout is killed; before that, the native stacks of its Python processes
(gdb, where installed) say which rank waited where -- a hang that shows up once in many CI runs
is otherwise left with nothing but the output printed before it.
"""
import os
import shutil
import subprocess

MAX_CHARS_PER_PROCESS = 6000


def _parents():
    """{pid: parent pid} of every process now running."""
    parents = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                # The command name is parenthesized and may hold spaces: fields follow its ')'.
                parents[int(entry)] = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue  # the process ended meanwhile
    return parents


def python_descendants(root):
    """(pid, command line) of each Python process below ``root`` (mpirun's proxies start the
    ranks in sessions of their own, so the process group would miss them)."""
    parents = _parents()
    below, frontier = set(), {root}
    while frontier:
        frontier = {pid for pid, parent in parents.items() if parent in frontier} - below
        below |= frontier
    found = []
    for pid in sorted(below):
        try:
            if "python" not in os.path.basename(os.readlink(f"/proc/{pid}/exe")):
                continue
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                found.append((pid, f.read().replace(b"\0", b" ").decode(errors="replace").strip()))
        except OSError:
            continue
    return found


def native_stacks(root, timeout_s=30):
    """The threads' stacks of each Python process below ``root``, as text."""
    gdb = shutil.which("gdb")
    if gdb is None:
        return "(no gdb here: no stacks)"
    parts = []
    for pid, cmdline in python_descendants(root):
        try:
            out = subprocess.run([gdb, "-batch", "-p", str(pid), "-ex", "thread apply all bt 16"],
                                 capture_output=True, text=True, timeout=timeout_s).stdout
        except subprocess.TimeoutExpired:
            out = "(gdb timed out)"
        stacks = "\n".join(line for line in out.splitlines() if line.startswith(("Thread ", "#")))
        parts.append(f"=== pid {pid}: {cmdline}\n{stacks[-MAX_CHARS_PER_PROCESS:]}")
    return "\n".join(parts)
