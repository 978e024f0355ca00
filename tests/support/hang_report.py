"""What the processes of a timed-out run were doing, for the failure message.

A run that exceeds its timeout is killed; before that, the native stacks of its Python processes
(gdb, where installed) say which rank waited where -- a hang that shows up once in many CI runs
is otherwise left with nothing but the output printed before it.
"""
import os
import shutil
import subprocess

MAX_CHARS_PER_PROCESS = 6000


def _stats():
    """{pid: (state, parent pid, command name)} of every process now in /proc (zombies too)."""
    stats = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                # The command name is parenthesized and may hold spaces: fields follow its ')'.
                head, tail = f.read().rsplit(")", 1)
            fields = tail.split()
            stats[int(entry)] = (fields[0], int(fields[1]), head.split("(", 1)[1])
        except (OSError, IndexError, ValueError):
            continue  # the process ended meanwhile
    return stats


def descendants(root):
    """(pid, state, command line) of each process below ``root``, zombies included (mpirun's
    proxies start the ranks in sessions of their own, so the process group would miss them)."""
    stats = _stats()
    below, frontier = set(), {root}
    while frontier:
        frontier = {pid for pid, (_, parent, _) in stats.items() if parent in frontier} - below
        below |= frontier
    found = []
    for pid in sorted(below):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmdline = f.read().replace(b"\0", b" ").decode(errors="replace").strip()
        except OSError:
            cmdline = ""
        found.append((pid, stats[pid][0], cmdline or f"[{stats[pid][2]}]"))
    return found


def _is_python(pid):
    try:
        return "python" in os.path.basename(os.readlink(f"/proc/{pid}/exe"))
    except OSError:
        return False  # a zombie, or gone


def native_stacks(root, timeout_s=30):
    """The processes below ``root`` (pid, state, command line) and the threads' stacks of each
    Python process among them, as text."""
    below = descendants(root)
    parts = ["processes below mpirun (pid state command):"]
    parts += [f"  {pid} {state} {cmdline[:200]}" for pid, state, cmdline in below]
    gdb = shutil.which("gdb")
    if gdb is None:
        return "\n".join(parts + ["(no gdb here: no stacks)"])
    for pid, _, cmdline in below:
        if not _is_python(pid):
            continue
        try:
            out = subprocess.run([gdb, "-batch", "-p", str(pid), "-ex", "thread apply all bt 16"],
                                 capture_output=True, text=True, timeout=timeout_s).stdout
        except subprocess.TimeoutExpired:
            out = "(gdb timed out)"
        stacks = "\n".join(line for line in out.splitlines() if line.startswith(("Thread ", "#")))
        parts.append(f"=== pid {pid}: {cmdline}\n{stacks[-MAX_CHARS_PER_PROCESS:]}")
    return "\n".join(parts)
