"""Training throughput three ways in one launch: collectives' DistributedOptimizer, the plain
optimizer with no communication (the baseline), and torch DistributedDataParallel on gloo.

    .venv/bin/mpirun -np 2 .venv/bin/python benchmarks/torch_training_bench.py [--model resnet18]
        [--batch-size 32] [--image-size 64] [--num-warmup-batches 5] [--num-batches-per-iter 5]
        [--num-rounds 10] [--fp16-allreduce] [--json PATH]

The models and training steps are those of examples/pytorch_synthetic_benchmark.py (one
model per mode, all built up front in the same processes). Method: after each mode's warm-up,
every round times one iteration (--num-batches-per-iter steps) of each mode, behind a barrier,
in an order that rotates from round to round, so a busy spell on a shared machine lands on
all modes alike rather than on whichever ran last. A round's figures: img/sec per rank (the
mean over ranks) and in total (the sum). Reported: medians over rounds with min-max, and
paired ratios (the median over rounds of one mode's rate over another's in the same round).
"""
import argparse
import json
import os
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "examples"))

import collectives.torch as hvd  # noqa: E402
from pytorch_synthetic_benchmark import MODELS, all_ranks, make_training_step, set_threads, time_batches  # noqa: E402

ORDER = ["collectives", "none", "ddp"]
LABELS = {"collectives": "collectives DistributedOptimizer", "none": "no communication", "ddp": "torch DDP (gloo)"}


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--model", default="resnet18", choices=sorted(MODELS))
    parser.add_argument("--batch-size", type=int, default=32, help="images per rank per step")
    parser.add_argument("--image-size", type=int, default=64, help="images are 3 x SIZE x SIZE")
    parser.add_argument("--num-warmup-batches", type=int, default=5, help="per mode")
    parser.add_argument("--num-batches-per-iter", type=int, default=5)
    parser.add_argument("--num-rounds", type=int, default=10, help="timed iterations of every mode")
    parser.add_argument("--fp16-allreduce", action="store_true", help="float16 gradients (collectives and DDP)")
    parser.add_argument("--num-threads", type=int, default=0, help="torch threads per rank; 0: cores / ranks")
    parser.add_argument("--json", help="also write the raw per-round, per-rank rates here (rank 0)")
    return parser.parse_args()


def paired_ratio(a, b):
    return float(np.median(np.asarray(a) / np.asarray(b)))


def table(per_rank, total, step_ms):
    """The comparison, one row per mode (rank 0 prints it)."""
    head = (f"{'mode':<34} {'img/s per rank':>14} {'(min-max)':>15} {'total img/s':>12} {'(min-max)':>15} "
            f"{'ms/step':>8} {'vs none':>8} {'vs DDP':>7}")
    lines = [head, "-" * len(head)]
    for mode in ORDER:
        r, t = per_rank[mode], total[mode]
        lines.append(f"{LABELS[mode]:<34} {np.median(r):>14.1f} {f'({r.min():.1f}-{r.max():.1f})':>15} "
                     f"{np.median(t):>12.1f} {f'({t.min():.1f}-{t.max():.1f})':>15} {np.median(step_ms[mode]):>8.1f} "
                     f"{paired_ratio(r, per_rank['none']):>8.2f} {paired_ratio(r, per_rank['ddp']):>7.2f}")
    return "\n".join(lines)


def main():
    args = parse_args()
    hvd.init()
    threads = set_threads(args.num_threads)
    rank0 = hvd.rank() == 0

    def log(line):
        if rank0:
            print(line, flush=True)

    log(f"torch training throughput: {args.model}, batch {args.batch_size} per rank, images "
        f"3x{args.image_size}x{args.image_size}, {hvd.size()} ranks, {threads} torch thread(s) per rank"
        + (", fp16 allreduce" if args.fp16_allreduce else ""))
    log(f"{args.num_rounds} rounds x {args.num_batches_per_iter} steps per mode; load average at start "
        f"{os.getloadavg()[0]:.2f}")
    steps = {}
    for mode in ORDER:
        steps[mode] = make_training_step(mode, args.model, args.batch_size, args.image_size, args.fp16_allreduce)
        hvd.barrier()
        time_batches(steps[mode], args.num_warmup_batches)

    seconds = {mode: [] for mode in ORDER}
    for i in range(args.num_rounds):
        for k in range(len(ORDER)):
            mode = ORDER[(i + k) % len(ORDER)]
            hvd.barrier()  # every rank starts the iteration together, in every mode
            seconds[mode].append(time_batches(steps[mode], args.num_batches_per_iter))

    images = args.batch_size * args.num_batches_per_iter
    per_rank, total, step_ms, raw = {}, {}, {}, {}
    for mode in ORDER:
        every = images / all_ranks(seconds[mode], f"bench.{mode}")  # (ranks, rounds) img/sec
        per_rank[mode], total[mode] = every.mean(axis=0), every.sum(axis=0)
        step_ms[mode] = 1000 * args.batch_size / per_rank[mode]
        raw[mode] = every.tolist()
    log(f"load average at end {os.getloadavg()[0]:.2f}\n")
    log(table(per_rank, total, step_ms))
    log("\nmedians over rounds; ratios are medians of same-round ratios of img/s per rank")
    if rank0 and args.json:
        with open(args.json, "w") as f:
            json.dump({"args": vars(args), "ranks": hvd.size(), "img_per_sec": raw}, f, indent=1)
    import torch.distributed as dist

    if dist.is_initialized():
        dist.destroy_process_group()
    hvd.shutdown()


if __name__ == "__main__":
    main()
