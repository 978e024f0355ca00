"""Per-step cost of collectives.keras.DistributedOptimizer in model.fit, against the same fit
without it, measured in one run.

    .venv/bin/mpirun -np 2 .venv/bin/python benchmarks/keras_fit_overhead.py [--steps 60] [--repeats 3]

For each model (an MLP 784-W-W-10 for each width W in --widths), every rank alternates
``--repeats`` times between two fits from the same initial weights on the same data:
  plain        model.fit with the bare Keras optimizer (no communication at all)
  distributed  model.fit with DistributedOptimizer (one py_function hop per step, in which the
               gradients are packed into one flat buffer and reduced in place by one request)
A step's time is the interval between consecutive ``on_train_batch_end`` calls; the first
--warmup steps of each fit (tracing) are dropped. Reported: the median step time of each
variant (median over ranks of each rank's median), the difference, and the ratio; and the
process CPU time per step that the distributed fit adds (``cpu+``: all threads, the engine's
included), which waiting for a descheduled peer inflates much less than the wall time.
TensorFlow gets cores / local ranks threads per rank, as in the examples. Absolute times on a
shared machine mean little: compare the columns of one run.

Between the fits, the same gradient bytes are also reduced outside Keras (each repetition,
so they see the same machine): ``raw``, one mpi4py Allreduce(IN_PLACE) of one flat float32
buffer of all parameters (the floor); ``flat``, collectives.allreduce_ of the same buffer (what
DistributedOptimizer submits: the engine without TensorFlow); ``grouped``,
collectives.grouped_allreduce_ of numpy arrays of the model's weight shapes (one request per
gradient, what it submitted before). Each: the median over repetitions, behind a barrier, of the
slowest rank. Issue 14's target is overhead <= raw + 0.3 ms; overhead - flat is what the Keras
side (the py_function hop, packing, tensor conversion) and the ranks' waiting for each other add.
"""
import argparse
import os
import statistics
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import collectives  # noqa: E402
import collectives.keras as hvd  # noqa: E402


class StepTimer(keras.callbacks.Callback):
    def __init__(self):
        super().__init__()
        self.ends = []
        self.cpu = []

    def on_train_batch_end(self, batch, logs=None):
        self.ends.append(time.perf_counter())
        self.cpu.append(time.process_time())


def make_model(width, seed):
    keras.utils.set_random_seed(seed)
    return keras.Sequential([keras.Input((784,)), keras.layers.Dense(width, activation="relu"),
                             keras.layers.Dense(width, activation="relu"), keras.layers.Dense(10)])


def fit_step_times(width, distributed, x, y, args):
    model = make_model(width, seed=0)
    optimizer = keras.optimizers.SGD(0.01, momentum=0.9)
    if distributed:
        optimizer = hvd.DistributedOptimizer(optimizer)
    model.compile(optimizer=optimizer, loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    timer = StepTimer()
    hvd.barrier()
    model.fit(x, y, batch_size=args.batch_size, epochs=1, shuffle=False, verbose=0, callbacks=[timer])
    periods = np.diff(timer.ends)[args.warmup:]
    cpu = np.diff(timer.cpu)[args.warmup:]
    return float(np.median(periods)), float(np.median(cpu))


def allreduce_times(model, reps=30):
    """(raw, flat, grouped) seconds: the slowest rank's median time to reduce the model's gradient
    bytes with one raw in-place mpi4py Allreduce, with collectives.allreduce_ of one flat buffer,
    and with collectives.grouped_allreduce_ of one array per weight (all Average)."""
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    shapes = [tuple(w.shape) for w in model.trainable_weights]
    flat = np.zeros(sum(int(np.prod(s)) for s in shapes), dtype=np.float32)
    arrays = [np.zeros(s, dtype=np.float32) for s in shapes]
    name = f"keras_fit_overhead.grouped.{flat.size}"

    def timed(op):
        times = np.empty(reps)
        for i in range(reps + 3):  # 3 untimed warm-ups
            comm.Barrier()
            t0 = time.perf_counter()
            op()
            if i >= 3:
                times[i - 3] = time.perf_counter() - t0
        comm.Allreduce(MPI.IN_PLACE, times, op=MPI.MAX)
        return float(np.median(times))

    raw = timed(lambda: comm.Allreduce(MPI.IN_PLACE, flat, op=MPI.SUM))
    packed = timed(lambda: collectives.allreduce_(flat, op=collectives.Average, name=name + ".flat"))
    grouped = timed(lambda: collectives.grouped_allreduce_(arrays, op=collectives.Average, name=name))
    return raw, packed, grouped


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--widths", type=int, nargs="+", default=[512, 64])
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--batch-size", type=int, default=64)
    args = parser.parse_args()

    load_before = os.getloadavg()[0]
    hvd.init()
    threads = max(1, (os.cpu_count() or 1) // hvd.local_size())
    tf.config.threading.set_intra_op_parallelism_threads(threads)
    tf.config.threading.set_inter_op_parallelism_threads(threads)
    rng = np.random.default_rng(hvd.rank())
    n = args.steps * args.batch_size
    x = rng.normal(size=(n, 784)).astype(np.float32)
    y = rng.integers(0, 10, size=n)

    if hvd.rank() == 0:
        print(f"# {hvd.size()} ranks, {threads} TF threads per rank, batch {args.batch_size} per rank, "
              f"{args.steps} steps per fit ({args.warmup} dropped), {args.repeats} alternating repeats")
        print(f"{'model':>22} {'params':>9} {'plain ms/step':>14} {'distributed ms/step':>20} "
              f"{'overhead ms':>12} {'ratio':>6} {'cpu+ ms':>8} {'raw ms':>7} {'flat ms':>8} {'grouped ms':>10} "
              f"{'overhead-raw':>12}")
    for width in args.widths:
        times = {False: [], True: []}
        reduce_times = []
        for _ in range(args.repeats):
            for distributed in (False, True):
                times[distributed].append(fit_step_times(width, distributed, x, y, args))
            reduce_times.append(allreduce_times(make_model(width, 0)))
        # This rank's median over repeats, then the median over ranks.
        mine = {d: (statistics.median(w for w, _ in v), statistics.median(c for _, c in v)) for d, v in times.items()}
        everyone = hvd.allgather_object(mine)
        plain = statistics.median(m[False][0] for m in everyone) * 1e3
        dist = statistics.median(m[True][0] for m in everyone) * 1e3
        cpu_added = statistics.median(m[True][1] - m[False][1] for m in everyone) * 1e3
        params = make_model(width, 0).count_params()
        raw, packed, grouped = (statistics.median(r[i] for r in reduce_times) * 1e3 for i in range(3))
        if hvd.rank() == 0:
            print(f"{'MLP 784-%d-%d-10' % (width, width):>22} {params:>9} {plain:>14.2f} {dist:>20.2f} "
                  f"{dist - plain:>12.2f} {dist / plain:>6.2f} {cpu_added:>8.2f} {raw:>7.2f} {packed:>8.2f} "
                  f"{grouped:>10.2f} {dist - plain - raw:>12.2f}", flush=True)
    if hvd.rank() == 0:
        print(f"# raw: one mpi4py Allreduce(IN_PLACE) of all gradient bytes; flat: collectives.allreduce_ of them; "
              f"grouped: collectives.grouped_allreduce_ of one array per weight; cpu+: process CPU per step added; "
              f"medians of {args.repeats} repeats; target overhead-raw <= 0.3 ms; load average {load_before:.2f} "
              f"before, {os.getloadavg()[0]:.2f} after")
    hvd.shutdown()


if __name__ == "__main__":
    main()
