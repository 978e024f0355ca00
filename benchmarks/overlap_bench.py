"""When DistributedOptimizer should start its allreduces: a training step's overhead over no
communication, paired block by block, for the torch optimizer with its default
(COLLECTIVES_OVERLAP_MIN_BYTES: a model under 1 MiB of gradients reduces them in step()), with
every allreduce started in backward (the knob at 0, Horovod's way), and raw mpi4py.

    .venv/bin/mpirun -np 2 .venv/bin/python benchmarks/overlap_bench.py [--model cnn] [--blocks 40]
        [--modes none,collectives,collectives_in_backward,raw]

Method: the modes' steps (benchmarks/small_models.py) run in blocks of --block-steps steps after
a barrier, the modes one after another within a round; a step's time is the slower rank's. Each
block's median minus the same round's no-communication median is one paired overhead, which
cancels the machine's slow drifts that an unpaired comparison of medians suffers on a shared
machine (two identical modes differed by 2.4 ms in busy_machine_bench's pooled quiet medians).
Reported: per mode the median paired overhead with its quartiles, and in how many rounds
collectives beat every other mode.
"""
import argparse
import os
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import numpy as np  # noqa: E402

import collectives.torch as hvd  # noqa: E402
from machine_info import describe_load, load_average, rotated  # noqa: E402
from small_models import MODE_LABELS, MODEL_LABELS, start_benchmark  # noqa: E402


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--model", default="cnn", choices=["mlp", "cnn"])
    parser.add_argument("--modes", default="none,collectives,collectives_in_backward,raw",
                        help="comma-separated; must include none (the baseline)")
    parser.add_argument("--blocks", type=int, default=40, help="rounds; each runs every mode for one block")
    parser.add_argument("--block-steps", type=int, default=5)
    parser.add_argument("--warmup-steps", type=int, default=5)
    return parser.parse_args()


def main():
    args = parse_args()
    modes = args.modes.split(",")
    if "none" not in modes:
        sys.exit("--modes must include none")
    rank0, loads_start, steps = start_benchmark("overlap benchmark", modes, args.model,
                                                warmup_steps=args.warmup_steps)
    times = {mode: [] for mode in modes}  # per round: this rank's step times of the block
    for _, mode in rotated(modes, args.blocks):
        hvd.barrier()
        block = []
        for _ in range(args.block_steps):
            start = time.perf_counter()
            steps[mode]()
            block.append((time.perf_counter() - start) * 1e3)
        times[mode].append(block)
    everyone = hvd.allgather_object(times)
    if not rank0:
        return
    slowest = {m: np.max([np.array(t[m]) for t in everyone], axis=0) for m in modes}  # [round, step]
    medians = {m: np.median(slowest[m], axis=1) for m in modes}
    print(f"\n{MODEL_LABELS[args.model]}, 2 ranks; {args.blocks} rounds x {args.block_steps} steps per mode")
    print(f"{'mode':52s} {'step ms':>8s} {'paired overhead ms (quartiles)':>32s}")
    for m in modes:
        d = medians[m] - medians["none"]
        q1, q2, q3 = np.percentile(d, [25, 50, 75])
        print(f"{MODE_LABELS[m]:52s} {statistics.median(medians[m]):8.2f} {q2:12.2f} ({q1:.2f} to {q3:.2f})")
    if "collectives" in modes:
        for m in modes:
            if m not in ("collectives", "none"):
                wins = int(np.sum(medians["collectives"] < medians[m]))
                print(f"rounds in which {MODE_LABELS['collectives']} was faster than {MODE_LABELS[m]}: "
                      f"{wins} of {args.blocks}")
    print(f"load at start: {describe_load(loads_start)}")
    print(f"load at end:   {describe_load(load_average())}")


if __name__ == "__main__":
    main()
