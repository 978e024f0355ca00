"""Plot of training throughput (samples/s) of small torch models on np ranks: collectives'
DistributedOptimizer, torch DDP on gloo, and no communication at all, written as a PNG.

    .venv/bin/python benchmarks/plot_training.py --out docs/training_throughput.png
        [--models mlp,cnn] [--rounds 15] [--steps-per-round 10] [--batch-size 64] [--np 2] [--json PATH]

Run it without mpirun: the driver starts one mpirun (under a hard timeout) whose ranks measure
every mode of every model, then draws the figure. Models and modes: benchmarks/small_models.py.
One torch thread per rank. Method: for each model, all three modes are built up front and warmed
up; then every round times --steps-per-round steps of each mode, each behind a barrier, in an order
that rotates from round to round (a busy spell on a shared machine hits all modes alike). A round's
throughput is np x batch x steps / (the slowest rank's time). Bars: median over rounds; whiskers:
the rounds' min and max; the label under each bar: the median of same-round ratios to "none".
"""
import argparse
import json
import os
import sys
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
COLORS = {"collectives": "tab:blue", "none": "tab:gray", "ddp": "tab:orange"}


# ------------------------------------------------------------------------------------ worker

def measure_model(model_name, args, hvd, modes):
    """{mode: [samples/s per round]} for one model."""
    from machine_info import rotated
    from small_models import make_training_step

    steps = {}
    for mode in modes:
        steps[mode] = make_training_step(mode, model_name, args.batch_size)
        hvd.barrier()
        for _ in range(args.warmup_steps):
            steps[mode]()
    rates = {mode: [] for mode in modes}
    for r, mode in rotated(modes, args.rounds):
        hvd.barrier()
        t0 = time.perf_counter()
        for _ in range(args.steps_per_round):
            steps[mode]()
        seconds = time.perf_counter() - t0
        slowest = max(hvd.allgather_object(seconds, name=f"plot.{model_name}.{mode}.{r}"))
        rates[mode].append(hvd.size() * args.batch_size * args.steps_per_round / slowest)
    return rates


def worker_main(args):
    import torch

    import collectives.torch as hvd
    from small_models import MODES

    torch.set_num_threads(1)
    hvd.init()
    result = {"np": hvd.size(), "rates": {}}
    for model_name in args.models.split(","):
        result["rates"][model_name] = measure_model(model_name, args, hvd, list(MODES))
    if hvd.rank() == 0:
        with open(args.json, "w") as f:
            json.dump(result, f)
    import torch.distributed as dist

    if dist.is_initialized():
        dist.destroy_process_group()
    hvd.shutdown()
    return 0


# ------------------------------------------------------------------------------------ driver

def summarize(rates):
    """{mode: (median, min, max, median ratio to none)} for one model's rounds."""
    none = np.asarray(rates["none"])
    return {mode: (float(np.median(v)), float(np.min(v)), float(np.max(v)),
                   float(np.median(np.asarray(v) / none)))
            for mode, v in rates.items()}


def plot(path, result, args, loads_before, loads_after, command, measured=None):
    from plot_common import caption_lines, import_pyplot, save_figure
    from small_models import MODE_LABELS, MODEL_LABELS

    plt = import_pyplot()
    models = list(result["rates"])
    fig, axes = plt.subplots(1, len(models), figsize=(5 * len(models), 4.6), squeeze=False)
    fig.subplots_adjust(bottom=0.25, top=0.88, wspace=0.3, left=0.08, right=0.98)
    for ax, model_name in zip(axes[0], models):
        summary = summarize(result["rates"][model_name])
        modes = [m for m in ("none", "collectives", "ddp") if m in summary]  # the baseline first
        med = [summary[m][0] for m in modes]
        err = [[summary[m][0] - summary[m][1] for m in modes], [summary[m][2] - summary[m][0] for m in modes]]
        bars = ax.bar(range(len(modes)), med, yerr=err, capsize=4, color=[COLORS[m] for m in modes])
        for bar, m in zip(bars, modes):
            ax.annotate(f"{summary[m][0]:.0f}\n({summary[m][3]:.2f}x none)", (bar.get_x() + bar.get_width() / 2, 0),
                        xytext=(0, 4), textcoords="offset points", ha="center", va="bottom", fontsize=8,
                        color="white", fontweight="bold")
        ax.set_xticks(range(len(modes)), [MODE_LABELS[m].replace(" ", "\n", 1) for m in modes], fontsize=8)
        ax.set_ylabel(f"samples/s, all {result['np']} ranks")
        ax.set_title(f"{MODEL_LABELS[model_name]}, batch {args.batch_size}/rank", fontsize=10)
        ax.grid(True, axis="y", alpha=0.3)
    fig.suptitle(f"training throughput, np={result['np']}, 1 torch thread per rank", fontsize=11)
    save_figure(fig, path, caption_lines(loads_before, loads_after, [
        f"bars: median of {args.rounds} interleaved rounds of {args.steps_per_round} steps; whiskers: min-max",
        f"command: {command}"], measured))


def print_table(result):
    from small_models import MODE_LABELS, MODEL_LABELS

    for model_name, rates in result["rates"].items():
        print(f"\n{MODEL_LABELS[model_name]}: samples/s on all ranks, median (min-max) over rounds")
        for mode, (med, lo, hi, ratio) in summarize(rates).items():
            print(f"  {MODE_LABELS[mode]:<34} {med:>9.0f} ({lo:.0f}-{hi:.0f})  {ratio:.2f}x none")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--out", default="docs/training_throughput.png", help="the PNG to write")
    parser.add_argument("--models", default="mlp,cnn", help="comma-separated subset of mlp,cnn")
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--steps-per-round", type=int, default=10)
    parser.add_argument("--warmup-steps", type=int, default=5)
    parser.add_argument("--batch-size", type=int, default=64, help="samples per rank per step")
    parser.add_argument("--np", type=int, default=2)
    parser.add_argument("--timeout", type=float, default=900, help="seconds the mpirun may take before it is killed")
    parser.add_argument("--json", help="driver: also write the per-round rates here; worker: rank 0's output")
    parser.add_argument("--replot", metavar="JSON", help="no measuring: redraw --out from the --json of an earlier run")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        return worker_main(args)

    from machine_info import load_average, utc_now
    from plot_common import import_pyplot, run_mpi_worker, venv_of_this_python

    import_pyplot()  # fail now, not after the measurements
    command = "python benchmarks/plot_training.py " + " ".join(argv if argv is not None else sys.argv[1:])
    forwarded = ["--worker", "--models", args.models, "--rounds", args.rounds, "--steps-per-round",
                 args.steps_per_round, "--warmup-steps", args.warmup_steps, "--batch-size", args.batch_size]
    if args.replot:
        with open(args.replot) as f:
            result = json.load(f)
        for key in ("rounds", "steps_per_round", "batch_size"):  # the figure describes the saved run
            setattr(args, key, result.get(key, getattr(args, key)))
    else:
        loads_before, measured = load_average(), utc_now()
        started = time.perf_counter()
        result = run_mpi_worker(venv_of_this_python(), args.np, os.path.abspath(__file__), forwarded, args.timeout)
        result.update({"load_before": loads_before, "load_after": load_average(), "measured": measured,
                       "command": command, "rounds": args.rounds, "steps_per_round": args.steps_per_round,
                       "batch_size": args.batch_size})
        print(f"measured in {time.perf_counter() - started:.0f} s")
    print_table(result)
    plot(args.out, result, args, result["load_before"], result["load_after"], result["command"], result["measured"])
    print(f"wrote {args.out} ({os.path.getsize(args.out) // 1024} KiB)")
    if args.json and not args.replot:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.path.insert(0, HERE)
    sys.exit(main())
