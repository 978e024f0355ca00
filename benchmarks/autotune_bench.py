"""Training throughput with the default engine settings against the settings COLLECTIVES_AUTOTUNE
picks, in one launch:

    .venv/bin/mpirun -np 2 .venv/bin/python benchmarks/autotune_bench.py [--model mlp|cnn]
        [--rounds 9] [--steps 20] [--warmup-samples 3] [--steps-per-sample 10] [--log PATH]

One torch thread per rank; the models and the step (hvd.DistributedOptimizer) are those of
benchmarks/small_models.py. Method:
  1. Tuning: init() with COLLECTIVES_AUTOTUNE=1 and train until every rank sees tuning over
     (Horovod's defaults: 3 warm-up samples, 10 steps per score); the chosen parameters are read
     from collectives.autotune.state(), and the log (CSV) is kept.
  2. Rounds, interleaved: each round runs the defaults and the tuned parameters (given as
     explicit COLLECTIVES_* knobs, so nothing is tuned again) in an order that alternates, each
     as init(), a fresh model, a few warm-up steps, --steps timed steps, shutdown(). A round's
     figure per setting is the slowest rank's ms/step.
Reported: medians over rounds with min-max, the median of same-round ratios (tuned / default;
below 1 is faster), the tuning phase's steps and ms/step, and the load average before and after.
"""
import argparse
import os
import sys
import time

import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import collectives.torch as hvd  # noqa: E402
from collectives import autotune, config  # noqa: E402
from small_models import MODEL_LABELS, MODELS, make_training_step  # noqa: E402

TUNED_KNOBS = config.AUTOTUNED  # the parameters autotuning chooses
AUTOTUNE_VARS = ("COLLECTIVES_AUTOTUNE", "COLLECTIVES_AUTOTUNE_LOG", "COLLECTIVES_AUTOTUNE_WARMUP_SAMPLES",
                 "COLLECTIVES_AUTOTUNE_STEPS_PER_SAMPLE")


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="mlp", choices=sorted(MODELS))
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--rounds", type=int, default=9)
    p.add_argument("--steps", type=int, default=20, help="timed steps per setting per round")
    p.add_argument("--warmup", type=int, default=3, help="untimed steps after each init()")
    p.add_argument("--warmup-samples", type=int, default=3)
    p.add_argument("--steps-per-sample", type=int, default=10)
    p.add_argument("--max-tuning-steps", type=int, default=3000)
    p.add_argument("--log", default="/tmp/collectives_autotune_bench.csv", help="the autotune CSV (rank 0)")
    return p.parse_args()


def set_knobs(values):
    """Engine knobs for the next init(): None clears a knob (and its HOROVOD_ twin)."""
    for key, value in values.items():
        knob = config.KNOBS[key]
        os.environ.pop(knob.horovod_env, None)
        if value is None:
            os.environ.pop(knob.env, None)
        else:
            os.environ[knob.env] = value


def tune(args):
    """Trains under autotuning until every rank sees it finished; (params, steps, ms per step)."""
    set_knobs({k: None for k in TUNED_KNOBS})
    os.environ.update({"COLLECTIVES_AUTOTUNE": "1", "COLLECTIVES_AUTOTUNE_LOG": args.log,
                       "COLLECTIVES_AUTOTUNE_WARMUP_SAMPLES": str(args.warmup_samples),
                       "COLLECTIVES_AUTOTUNE_STEPS_PER_SAMPLE": str(args.steps_per_sample)})
    hvd.init()
    step = make_training_step("collectives", args.model, args.batch_size)
    times, done = [], False
    while not done and len(times) < args.max_tuning_steps:
        t0 = time.perf_counter()
        step()
        times.append(time.perf_counter() - t0)
        flag = torch.tensor([0 if autotune.state()["tuning"] else 1], dtype=torch.int32)
        done = bool(hvd.allreduce(flag, op=hvd.Min, name="bench.tuned").item())  # all ranks stop together
    state = dict(autotune.state(), rank=hvd.rank(), size=hvd.size())
    hvd.shutdown()
    for var in AUTOTUNE_VARS:
        os.environ.pop(var, None)
    if state["tuning"]:
        raise SystemExit(f"autotuning did not finish within {args.max_tuning_steps} steps")
    return state, len(times), 1000 * float(np.median(times))


def timed_run(args, knobs):
    """init() with these knobs, warm up, time --steps steps; the slowest rank's ms/step."""
    set_knobs(knobs)
    hvd.init()
    step = make_training_step("collectives", args.model, args.batch_size)
    for _ in range(args.warmup):
        step()
    hvd.barrier()
    t0 = time.perf_counter()
    for _ in range(args.steps):
        step()
    ms = 1000 * (time.perf_counter() - t0) / args.steps
    slowest = max(hvd.allgather_object(ms))
    hvd.shutdown()
    return slowest


def main():
    args = parse_args()
    torch.set_num_threads(1)
    load_before = os.getloadavg()
    state, tuning_steps, tuning_ms = tune(args)
    rank0 = state["rank"] == 0
    tuned = {"fusion_threshold": str(state["fusion_threshold"]), "cycle_time_ms": f"{state['cycle_time_ms']:g}",
             "hierarchical_allreduce": str(int(state["hierarchical_allreduce"])),
             "hierarchical_allgather": str(int(state["hierarchical_allgather"]))}
    defaults = {k: None for k in TUNED_KNOBS}
    ms = {"default": [], "tuned": []}
    for i in range(args.rounds):
        for name in (("default", "tuned") if i % 2 == 0 else ("tuned", "default")):
            ms[name].append(timed_run(args, defaults if name == "default" else tuned))
    load_after = os.getloadavg()
    if not rank0:
        return
    size = state["size"]
    d, t = np.array(ms["default"]), np.array(ms["tuned"])
    print(f"autotune benchmark: {MODEL_LABELS[args.model]}, batch {args.batch_size} per rank, np={size}, "
          f"1 torch thread per rank, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}")
    print(f"load average before {load_before[0]:.2f} {load_before[1]:.2f} {load_before[2]:.2f}, "
          f"after {load_after[0]:.2f} {load_after[1]:.2f} {load_after[2]:.2f}")
    print(f"tuning: {tuning_steps} steps, median {tuning_ms:.2f} ms/step, {state['samples']} scored samples "
          f"(log: {args.log})")
    print(f"chosen: fusion threshold {state['fusion_threshold'] / 2**20:g} MiB, cycle time "
          f"{state['cycle_time_ms']:g} ms, hierarchical allreduce {state['hierarchical_allreduce']}, "
          f"hierarchical allgather {state['hierarchical_allgather']}")
    print(f"{args.rounds} interleaved rounds x {args.steps} steps; ms/step of the slowest rank:")
    for name, arr in (("defaults", d), ("tuned", t)):
        print(f"  {name:<9} median {np.median(arr):7.2f}  (min {arr.min():.2f}, max {arr.max():.2f})")
    print(f"  tuned / defaults: {float(np.median(t / d)):.3f} (median of same-round ratios; < 1 is faster)")


if __name__ == "__main__":
    main()
