"""What a benchmark figure was measured on: the machine, its load, the date.

Figures from a shared machine mean little without the load they were taken under, so every
plot and table of benchmarks/ quotes these lines (see docs/performance.md).
"""
import datetime
import glob
import os
import platform


def cpu_model():
    """The CPU's model name from /proc/cpuinfo (Linux), else platform's guess."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def has_gpu():
    """An NVIDIA device node is the only GPU these benchmarks could use (NCCL)."""
    return bool(glob.glob("/dev/nvidia[0-9]*"))


def load_average():
    """The 1-, 5- and 15-minute load averages."""
    try:
        return os.getloadavg()
    except OSError:
        return (float("nan"),) * 3


def describe_machine():
    """One line: cores, CPU, GPU or not."""
    return f"{os.cpu_count()}-core {platform.system()} machine ({cpu_model()}), {'GPU present' if has_gpu() else 'no GPU'}"


def describe_load(loads):
    return "load average " + " / ".join(f"{v:.2f}" for v in loads) + " (1/5/15 min)"


def utc_now():
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")


def rotated(names, rounds):
    """(round, name) for each name in each round, the order rotating between rounds: no variant
    always runs first, or always after the same one (the interleaved rounds of DESIGN.md's
    measuring method)."""
    for r in range(rounds):
        for k in range(len(names)):
            yield r, names[(r + k) % len(names)]
