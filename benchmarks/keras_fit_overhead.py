"""Per-step cost of collectives.keras.DistributedOptimizer in model.fit, against the same fit
without it, measured in one run.

    .venv/bin/mpirun -np 2 .venv/bin/python benchmarks/keras_fit_overhead.py [--steps 60] [--repeats 3]

For each model (an MLP 784-W-W-10 for each width W in --widths), every rank alternates
``--repeats`` times between these fits from the same initial weights on the same data:
  plain        model.fit with the bare Keras optimizer (no communication at all)
  distributed  model.fit with DistributedOptimizer: the gradients reduced by the engine's own
               TensorFlow op (csrc/tensorflow/tensorflow_kernels.cc: packed into one flat buffer, reduced
               in place by one request, no Python in the step)
  py_function  the same through the tf.py_function hop it falls back to (the path before the op)
  raw in fit   the plain fit with one raw mpi4py Allreduce(IN_PLACE) of the gradient bytes after
               every step (a callback): what moving those bytes costs inside training on this
               machine, with no framework integration at all
  raw in graph raw mpi4py at the op's place in the step: the optimizer's apply flattens the
               gradients, averages them with one Allreduce(IN_PLACE) inside a tf.numpy_function
               (on TensorFlow's thread, while the step runs), and applies them
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
from collectives.adapters.tensorflow import engine_ops  # noqa: E402


VARIANTS = ("plain", "raw in fit", "distributed", "py_function", "raw in graph")


class StepTimer(keras.callbacks.Callback):
    def __init__(self):
        super().__init__()
        self.ends = []
        self.cpu = []

    def on_train_batch_end(self, batch, logs=None):
        self.ends.append(time.perf_counter())
        self.cpu.append(time.process_time())


class RawAllreduceEachStep(keras.callbacks.Callback):
    """After every step of a plain fit, one raw mpi4py Allreduce(IN_PLACE) of as many float32
    values as the model has parameters: what moving the gradient bytes costs inside training
    here (with the ranks kept in step, and the caches holding the model's working set instead
    of a benchmark loop's one buffer), without any framework integration."""

    def __init__(self, count):
        super().__init__()
        self.flat = np.zeros(count, dtype=np.float32)

    def on_train_batch_end(self, batch, logs=None):
        from mpi4py import MPI

        MPI.COMM_WORLD.Allreduce(MPI.IN_PLACE, self.flat, op=MPI.SUM)


def _raw_average(flat):
    """In a tf.numpy_function: the ranks' mean of ``flat`` by one raw mpi4py Allreduce."""
    from mpi4py import MPI

    out = np.array(flat)  # numpy_function's input may be read-only
    MPI.COMM_WORLD.Allreduce(MPI.IN_PLACE, out, op=MPI.SUM)
    out /= MPI.COMM_WORLD.Get_size()
    return out


class RawInGraphSGD(keras.optimizers.SGD):
    """SGD whose apply first averages the gradients over the ranks with raw mpi4py, inside the
    step's graph where DistributedOptimizer's op runs (the "raw in graph" variant)."""

    def apply(self, grads, trainable_variables=None):
        grads = [tf.convert_to_tensor(g) for g in grads]
        flat = tf.concat([tf.reshape(g, [-1]) for g in grads], axis=0)
        reduced = tf.numpy_function(_raw_average, [flat], tf.float32, stateful=True)
        reduced.set_shape(flat.shape)
        parts = tf.split(reduced, [int(np.prod(g.shape)) for g in grads])
        return super().apply([tf.reshape(p, g.shape) for p, g in zip(parts, grads)], trainable_variables)


def make_model(width, seed):
    keras.utils.set_random_seed(seed)
    return keras.Sequential([keras.Input((784,)), keras.layers.Dense(width, activation="relu"),
                             keras.layers.Dense(width, activation="relu"), keras.layers.Dense(10)])


def timed_fit(width, variant, x, y, args, more_callbacks=()):
    """One fit of ``variant`` (see the module docstring) from the same initial weights, behind a
    barrier; returns its StepTimer."""
    model = make_model(width, seed=0)
    optimizer = (RawInGraphSGD if variant == "raw in graph" else keras.optimizers.SGD)(0.01, momentum=0.9)
    if variant in ("distributed", "py_function"):
        optimizer = hvd.DistributedOptimizer(optimizer)
    model.compile(optimizer=optimizer, loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    timer = StepTimer()
    callbacks = [timer, *more_callbacks]
    if variant == "raw in fit":
        callbacks.insert(0, RawAllreduceEachStep(model.count_params()))
    hvd.barrier()
    model.fit(x, y, batch_size=args.batch_size, epochs=1, shuffle=False, verbose=0, callbacks=callbacks)
    return timer


def fit_step_times(width, variant, x, y, args):
    engine_ops.set_enabled(variant != "py_function")
    timer = timed_fit(width, variant, x, y, args)
    periods = np.diff(timer.ends)[args.warmup:]
    cpu = np.diff(timer.cpu)[args.warmup:]
    return float(np.median(periods)), float(np.median(cpu))


def init_with_data(args):
    """hvd.init(), TensorFlow's threads (the cores shared by the local ranks, as in the examples)
    and this rank's inputs for --steps batches; returns (threads per rank, x, y)."""
    hvd.init()
    threads = max(1, (os.cpu_count() or 1) // hvd.local_size())
    tf.config.threading.set_intra_op_parallelism_threads(threads)
    tf.config.threading.set_inter_op_parallelism_threads(threads)
    rng = np.random.default_rng(hvd.rank())
    n = args.steps * args.batch_size
    return threads, rng.normal(size=(n, 784)).astype(np.float32), rng.integers(0, 10, size=n)


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
    parser.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=VARIANTS,
                        help="which fits to run (plain always runs: the others are measured against it)")
    args = parser.parse_args()

    load_before = os.getloadavg()[0]
    threads, x, y = init_with_data(args)

    variants = [v for v in VARIANTS if v == "plain" or v in args.variants]
    if hvd.rank() == 0:
        print(f"# {hvd.size()} ranks, {threads} TF threads per rank, batch {args.batch_size} per rank, "
              f"{args.steps} steps per fit ({args.warmup} dropped), {args.repeats} alternating repeats")
        print(f"{'model':>22} {'params':>9} {'plain ms':>9} {'raw-in-fit ms':>14} {'raw-in-graph ms':>16} "
              f"{'op ms':>7} {'py_fn ms':>9} "
              f"{'overhead op':>12} "
              f"{'overhead py_fn':>15} {'cpu+ op':>8} {'cpu+ py_fn':>10} {'raw ms':>7} {'flat ms':>8} "
              f"{'grouped ms':>10} {'op-raw':>7} {'py_fn-raw':>10}")
    for width in args.widths:
        times = {v: [] for v in variants}
        reduce_times = []
        for _ in range(args.repeats):
            for variant in variants:
                times[variant].append(fit_step_times(width, variant, x, y, args))
            reduce_times.append(allreduce_times(make_model(width, 0)))
        # This rank's median over repeats, then the median over ranks.
        mine = {v: (statistics.median(w for w, _ in t), statistics.median(c for _, c in t)) for v, t in times.items()}
        everyone = hvd.allgather_object(mine)
        step = {v: statistics.median(m[v][0] for m in everyone) * 1e3 for v in variants}
        cpu_added = {v: statistics.median(m[v][1] - m["plain"][1] for m in everyone) * 1e3 for v in variants}
        params = make_model(width, 0).count_params()
        raw, packed, grouped = (statistics.median(r[i] for r in reduce_times) * 1e3 for i in range(3))
        for v in VARIANTS:  # a variant not run prints as nan
            step.setdefault(v, float("nan"))
            cpu_added.setdefault(v, float("nan"))
        over = {v: step[v] - step["plain"] for v in VARIANTS}
        if hvd.rank() == 0:
            print(f"{'MLP 784-%d-%d-10' % (width, width):>22} {params:>9} {step['plain']:>9.2f} "
                  f"{step['raw in fit']:>14.2f} {step['raw in graph']:>16.2f} {step['distributed']:>7.2f} "
                  f"{step['py_function']:>9.2f} {over['distributed']:>12.2f} "
                  f"{over['py_function']:>15.2f} {cpu_added['distributed']:>8.2f} {cpu_added['py_function']:>10.2f} "
                  f"{raw:>7.2f} {packed:>8.2f} {grouped:>10.2f} {over['distributed'] - raw:>7.2f} "
                  f"{over['py_function'] - raw:>10.2f}", flush=True)
    if hvd.rank() == 0:
        print(f"# raw-in-fit: plain fit with a raw mpi4py Allreduce of the gradient bytes after each step; "
              f"raw-in-graph: the gradients averaged by a raw mpi4py Allreduce in a tf.numpy_function in the step; "
              f"op: DistributedOptimizer through the engine's TensorFlow op; py_fn: through tf.py_function; "
              f"overhead: step time over plain; raw: one mpi4py Allreduce(IN_PLACE) of all gradient bytes; flat: "
              f"collectives.allreduce_ of them; grouped: collectives.grouped_allreduce_ of one array per weight; "
              f"cpu+: process CPU per step added; medians of {args.repeats} repeats; target overhead-raw <= 0.3 ms; "
              f"load average {load_before:.2f} before, {os.getloadavg()[0]:.2f} after")
    hvd.shutdown()


if __name__ == "__main__":
    main()
