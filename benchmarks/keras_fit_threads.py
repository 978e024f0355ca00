"""Where the time of a model.fit step goes, per thread: each fit's step times (median, 10th and
90th percentiles) and, for each kind of thread, the CPU time and the time spent ready to run but
waiting for a core, per step.

    .venv/bin/mpirun -np 2 .venv/bin/python benchmarks/keras_fit_threads.py [--width 64] [--steps 300]
    COLLECTIVES_LATENCY_STAGES=1 .venv/bin/mpirun -np 2 -genv COLLECTIVES_LATENCY_STAGES 1 \\
        .venv/bin/python benchmarks/keras_fit_threads.py --variants distributed

The fits are those of benchmarks/keras_fit_overhead.py (plain, raw in fit, distributed), one after
another in each of --repeats rounds. Threads are grouped by name: ``main`` (the Python thread that
runs the fit), ``coll-engine`` (the engine's, csrc/common/thread_name.h), ``tf_*`` (TensorFlow's pools),
``python`` (threads started without a name of their own, such as Keras's). Their CPU and
run-queue times come from /proc/<pid>/task/*/schedstat (nanoseconds, unlike the clock ticks of
/proc/.../stat, which miss short bursts), per step from the end of step --warmup to the end of the
fit (no tracing), on rank 0. The time a thread waits in a run queue is what a busy core costs it:
on a 2-core machine with two ranks, the engine thread waits there behind TensorFlow's threads at
every hand-off. With COLLECTIVES_LATENCY_STAGES=1 the engine prints at shutdown the means of each
operation's stages (csrc/monitor/latency_stages.h); the first step's wait for the other rank's tracing
weighs on them.
"""
import argparse
import glob
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import numpy as np  # noqa: E402

import collectives.keras as hvd  # noqa: E402
from keras_fit_overhead import init_with_data, timed_fit  # noqa: E402

VARIANTS = ("plain", "raw in fit", "distributed")


def thread_times():
    """{tid: (kind, cpu seconds, run-queue seconds)} of this process's threads."""
    out = {}
    main = str(os.getpid())
    for task in glob.glob(f"/proc/{main}/task/*"):
        tid = task.rsplit("/", 1)[1]
        try:
            with open(task + "/comm") as f:
                name = f.read().strip()
            with open(task + "/schedstat") as f:
                cpu_ns, queued_ns = (int(v) for v in f.read().split()[:2])
        except OSError:  # the thread ended
            continue
        kind = "main" if tid == main else name
        out[tid] = (kind, cpu_ns / 1e9, queued_ns / 1e9)
    return out


class ThreadTimesAround(keras.callbacks.Callback):
    """thread_times() at the end of step ``first`` and of the fit's last step: the steady state,
    without the tracing of the first steps."""

    def __init__(self, first):
        super().__init__()
        self.first = first
        self.at_first = self.at_last = None
        self.last_step = -1

    def on_train_batch_end(self, batch, logs=None):
        if batch == self.first:
            self.at_first = thread_times()
        self.last_step = batch

    def on_train_end(self, logs=None):
        self.at_last = thread_times()


def per_step(before, after, steps):
    """{kind: [cpu ms, run-queue ms]} per step between two thread_times()."""
    kinds = {}
    for tid, (kind, cpu, queued) in after.items():
        _, cpu0, queued0 = before.get(tid, (kind, 0.0, 0.0))
        k = kinds.setdefault(kind, [0.0, 0.0])
        k[0] += (cpu - cpu0) / steps * 1e3
        k[1] += (queued - queued0) / steps * 1e3
    return kinds


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--width", type=int, default=64)
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=VARIANTS)
    args = parser.parse_args()

    threads, x, y = init_with_data(args)
    if hvd.rank() == 0:
        print(f"# {hvd.size()} ranks, {threads} TF threads per rank, MLP 784-{args.width}-{args.width}-10, "
              f"batch {args.batch_size}, {args.steps} steps per fit; load average {os.getloadavg()[0]:.2f}")
    for repeat in range(args.repeats):
        for variant in args.variants:
            around = ThreadTimesAround(args.warmup)
            timer = timed_fit(args.width, variant, x, y, args, [around])
            kinds = per_step(around.at_first, around.at_last, around.last_step - args.warmup)
            ms = np.diff(timer.ends)[args.warmup:] * 1e3
            if hvd.rank() == 0:
                cpu = "  ".join(f"{k} {c:.2f}/{q:.2f}" for k, (c, q) in sorted(kinds.items()) if c + q >= 0.005)
                print(f"{variant:>11} round {repeat}: step ms median {np.median(ms):.2f} p10 {np.percentile(ms, 10):.2f} "
                      f"p90 {np.percentile(ms, 90):.2f} | cpu/run-queue ms per step: {cpu}", flush=True)
    if hvd.rank() == 0:
        print(f"# load average {os.getloadavg()[0]:.2f}")
    hvd.shutdown()


if __name__ == "__main__":
    main()
