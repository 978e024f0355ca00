"""Training step on a busy machine: how much collectives' DistributedOptimizer step and torch DDP's
(gloo) step slow down when one extra process spins on a core, as a data loader worker would.

    .venv/bin/mpirun -np 2 .venv/bin/python benchmarks/busy_machine_bench.py
        [--model mlp] [--modes collectives,none,ddp,raw,barrier,gloo_barrier] [--batch-size 64]
        [--rounds 10] [--steps 10] [--warmup-steps 5] [--json PATH]
    .venv/bin/python benchmarks/busy_machine_bench.py --pool RUN1.json RUN2.json ...

The spinner is one process (`while True: pass`) started by rank 0 at the beginning, paused
(SIGSTOP) for the quiet phases, resumed (SIGCONT) for the busy ones, and killed at the end; it
dies with rank 0 however rank 0 ends (PR_SET_PDEATHSIG), so it never outlives the benchmark. It
is not pinned: the scheduler places it, as it would a data loader.

Method: the models are built once per mode (benchmarks/small_models.py: collectives, ddp, and
none = no communication, which shows how much the compute alone slows down; raw = one raw
mpi4py Allreduce of the flattened gradients after backward, the raw-MPI reference; barrier = no
communication but one raw mpi4py Barrier per step, which shows what keeping two ranks in step
costs on a busy machine with no data moved). Every round has a
quiet and a busy phase, in an order that alternates between rounds; within a phase each mode
runs --steps steps behind a barrier, in an order that rotates. A step's time is the slowest
rank's time for the block / --steps. Reported: the median step time per mode and phase over
rounds, the slowdown = the median over rounds of the same round's busy / quiet ratio, and the CPU
time per step of the threads other than the training thread (time.process_time - thread_time:
the engine's, MPI's or gloo's threads), which shows how much a mode's waiting costs the machine.
"Idle" = the core time per step that no thread of any rank used: ranks x step time - the CPU time
of all ranks' processes (in the quiet phases, where nothing else runs, it is time the cores sat
idle while threads waited).
Target (issue 14, item 5): the DistributedOptimizer's slowdown no worse than DDP's.

--pool reads the --json files of several runs and prints, over all their rounds together, each
mode's median slowdown (and quartiles), the milliseconds the spinner added, the idle core time in
quiet steps, and in how many rounds the DistributedOptimizer slowed down more than each other mode
(no MPI; one run's rounds are few against the spread of a busy phase).
"""
import argparse
import ctypes
import json
import os
import signal
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)


import collectives.torch as hvd  # noqa: E402
from machine_info import describe_load, load_average  # noqa: E402
from small_models import (MODE_LABELS, MODEL_LABELS, MODES, REFERENCE_MODES, VARIANT_MODES,  # noqa: E402
                          start_benchmark)

PR_SET_PDEATHSIG = 1  # linux/prctl.h


def _die_with_parent():
    """In the spinner, before exec: the kernel sends it SIGKILL when its parent (rank 0) exits."""
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


class Spinner:
    """One process burning one core, paused until ``busy()``."""

    def __init__(self):
        self.proc = subprocess.Popen([sys.executable, "-c", "while True: pass"], preexec_fn=_die_with_parent)
        self.quiet()

    def busy(self):
        os.kill(self.proc.pid, signal.SIGCONT)

    def quiet(self):
        os.kill(self.proc.pid, signal.SIGSTOP)

    def cpu_seconds(self):
        """User + system CPU time the spinner has had so far (fields 14, 15 of /proc/PID/stat)."""
        with open(f"/proc/{self.proc.pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def stop(self):
        self.proc.kill()
        self.proc.wait()


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--model", default="mlp", choices=["mlp", "cnn"])
    parser.add_argument("--modes", default=",".join(MODES + REFERENCE_MODES),
                        help="comma-separated, from " + ", ".join(MODES + VARIANT_MODES + REFERENCE_MODES))
    parser.add_argument("--batch-size", type=int, default=64, help="samples per rank per step")
    parser.add_argument("--rounds", type=int, default=10, help="each round: one quiet and one busy phase")
    parser.add_argument("--steps", type=int, default=10, help="steps per mode per phase")
    parser.add_argument("--warmup-steps", type=int, default=5)
    parser.add_argument("--json", help="also write the per-round step times here (rank 0)")
    parser.add_argument("--pool", nargs="+", metavar="JSON", help="summarize these runs' --json files instead")
    return parser.parse_args()


def time_block(step, count, tag):
    """Seconds per step of ``count`` steps, the slowest rank's (gathered after the timed block); the
    CPU seconds per step the process spent outside the training thread (the engine's or gloo's
    threads: waiting that polls shows here), the largest over ranks; and the core seconds per step
    that no thread of any rank used (ranks x step - all ranks' process CPU time)."""
    hvd.barrier()
    t0, cpu0, own0 = time.perf_counter(), time.process_time(), time.thread_time()
    for _ in range(count):
        step()
    seconds = time.perf_counter() - t0
    process_cpu = time.process_time() - cpu0
    others = process_cpu - (time.thread_time() - own0)
    gathered = hvd.allgather_object((seconds, others, process_cpu), name=tag)
    slowest = max(g[0] for g in gathered)
    idle = len(gathered) * slowest - sum(g[2] for g in gathered)
    return slowest / count, max(g[1] for g in gathered) / count, idle / count


def run_rounds(args, steps, spinner):
    """{phase: {mode: [seconds per step, one per round]}}, and the spinner's share of a core while busy."""
    modes = list(steps)
    times = {phase: {mode: [] for mode in modes} for phase in ("quiet", "busy")}
    other_cpu = {phase: {mode: [] for mode in modes} for phase in ("quiet", "busy")}
    idle = {phase: {mode: [] for mode in modes} for phase in ("quiet", "busy")}
    busy_wall, busy_cpu = 0.0, 0.0
    for r in range(args.rounds):
        for phase in (("quiet", "busy") if r % 2 == 0 else ("busy", "quiet")):
            if spinner is not None:
                cpu0, wall0 = spinner.cpu_seconds(), time.perf_counter()
                spinner.busy() if phase == "busy" else spinner.quiet()
            for k in range(len(modes)):
                mode = modes[(r + k) % len(modes)]
                seconds, others, unused = time_block(steps[mode], args.steps, f"busy.{phase}.{mode}.{r}")
                times[phase][mode].append(seconds)
                other_cpu[phase][mode].append(others)
                idle[phase][mode].append(unused)
            if spinner is not None and phase == "busy":
                spinner.quiet()
                busy_wall += time.perf_counter() - wall0
                busy_cpu += spinner.cpu_seconds() - cpu0
    return times, other_cpu, idle, (busy_cpu / busy_wall if busy_wall else None)


def report(args, times, other_cpu, idle, share, loads):
    modes = list(times["quiet"])
    print(f"\n{MODEL_LABELS[args.model]}, batch {args.batch_size}/rank, {hvd.size()} ranks x 1 torch thread; "
          f"{args.rounds} rounds x {args.steps} steps per mode and phase")
    if share is not None:
        print(f"the spinner had {share:.0%} of a core while busy (its CPU time / the busy phases' wall time)")
    head = (f"{'mode':<36} {'quiet ms/step':>13} {'busy ms/step':>13} {'slowdown':>9} {'(min-max)':>13} "
            f"{'other threads CPU ms/step quiet, busy':>38} {'idle core ms/step quiet':>24}")
    print(head + "\n" + "-" * len(head))
    rows = {}
    for mode in modes:
        quiet, busy = times["quiet"][mode], times["busy"][mode]
        ratios = [b / q for b, q in zip(busy, quiet)]
        rows[mode] = {"quiet_ms": statistics.median(quiet) * 1e3, "busy_ms": statistics.median(busy) * 1e3,
                      "slowdown": statistics.median(ratios),
                      "other_cpu_quiet_ms": statistics.median(other_cpu["quiet"][mode]) * 1e3,
                      "other_cpu_busy_ms": statistics.median(other_cpu["busy"][mode]) * 1e3,
                      "idle_quiet_ms": statistics.median(idle["quiet"][mode]) * 1e3}
        cpu = f"{rows[mode]['other_cpu_quiet_ms']:.1f}, {rows[mode]['other_cpu_busy_ms']:.1f}"
        print(f"{MODE_LABELS[mode]:<36} {rows[mode]['quiet_ms']:>13.2f} {rows[mode]['busy_ms']:>13.2f} "
              f"{rows[mode]['slowdown']:>8.2f}x {f'({min(ratios):.2f}-{max(ratios):.2f})':>13} {cpu:>38} {rows[mode]['idle_quiet_ms']:>24.1f}")
    print("medians over rounds; slowdown = median of same-round busy/quiet ratios; other threads CPU = CPU time "
          "per step of the threads other than the training thread (engine, MPI, gloo), the largest rank's; "
          "idle = ranks x step time - all ranks' CPU time")
    print(f"load at start: {describe_load(loads[0])}\nload at end:   {describe_load(loads[1])}")
    if "collectives" in rows and "ddp" in rows:
        ok = rows["collectives"]["slowdown"] <= rows["ddp"]["slowdown"]
        print(f"target (DistributedOptimizer degrades no more than DDP): {'met' if ok else 'NOT met'} "
              f"({rows['collectives']['slowdown']:.2f}x vs {rows['ddp']['slowdown']:.2f}x)")
    return rows


def pool(paths):
    """Every round of every run, by mode: the table of --pool."""
    rounds, idle = {}, {}
    for path in paths:
        with open(path) as f:
            run = json.load(f)
        times = run["seconds_per_step"]
        for mode in times["quiet"]:
            rounds.setdefault(mode, []).extend(zip(times["quiet"][mode], times["busy"][mode]))
            idle.setdefault(mode, []).extend(run.get("idle_core_seconds_per_step", {}).get("quiet", {}).get(mode, []))
    head = (f"{'mode':<36} {'rounds':>6} {'quiet ms':>9} {'busy ms':>8} {'added ms':>9} {'slowdown':>9} "
            f"{'(quartiles)':>13} {'idle core ms quiet':>19}")
    print(f"{len(paths)} runs pooled\n{head}\n" + "-" * len(head))
    for mode, pairs in rounds.items():
        ratios = [b / q for q, b in pairs]
        q1, _, q3 = statistics.quantiles(ratios, n=4)
        unused = f"{statistics.median(idle[mode]) * 1e3:.1f}" if idle[mode] else "-"  # older runs lack it
        print(f"{MODE_LABELS[mode]:<36} {len(pairs):>6} {statistics.median(q for q, _ in pairs) * 1e3:>9.1f} "
              f"{statistics.median(b for _, b in pairs) * 1e3:>8.1f} "
              f"{statistics.median((b - q) * 1e3 for q, b in pairs):>9.1f} {statistics.median(ratios):>8.2f}x "
              f"{f'({q1:.2f}-{q3:.2f})':>13} {unused:>19}")
    ours = [b / q for q, b in rounds.get("collectives", [])]
    for mode, pairs in rounds.items():
        if mode != "collectives" and ours and len(pairs) == len(ours):
            worse = sum(o > b / q for o, (q, b) in zip(ours, pairs))
            print(f"rounds in which the DistributedOptimizer slowed down more than {MODE_LABELS[mode]}: "
                  f"{worse} of {len(ours)}")


def main():
    args = parse_args()
    if args.pool:
        return pool(args.pool)
    rank0, loads_start, steps = start_benchmark("busy-machine benchmark", args.modes.split(","), args.model,
                                                args.batch_size, args.warmup_steps)
    spinner = Spinner() if rank0 else None
    try:
        times, other_cpu, idle, share = run_rounds(args, steps, spinner)
    finally:
        if spinner is not None:
            spinner.stop()
    loads_end = load_average()
    if rank0:
        rows = report(args, times, other_cpu, idle, share, (loads_start, loads_end))
        if args.json:
            with open(args.json, "w") as f:
                json.dump({"args": vars(args), "ranks": hvd.size(), "seconds_per_step": times,
                           "other_threads_cpu_seconds_per_step": other_cpu,
                           "idle_core_seconds_per_step": idle, "summary": rows,
                           "spinner_core_share": share, "load_start": loads_start, "load_end": loads_end}, f, indent=1)
    import torch.distributed as dist

    if dist.is_initialized():
        dist.destroy_process_group()
    hvd.shutdown()


if __name__ == "__main__":
    main()
