"""Callers that run the engine's cycles themselves (csrc/core/engine_inline.cc): every result against
a numpy reference computed from every rank's inputs, while the cycle changes hands between the
engine thread and several waiting threads.

Each rank runs THREADS Python threads at once, each a sequence of synchronous verbs (allreduce of
every size class: carried by the negotiation, fused, shared memory, plain MPI; allgather;
broadcast) under names of its own, plus, on the main thread, asynchronous allreduces synchronized
out of order. Ranks sleep for different short times between operations, so that sometimes a
peer's engine thread, sometimes a caller, starts a cycle, and a caller sometimes finds the cycle
taken. Then one thread alone repeats two cached allreduces, whose cycles its calls run.
Prints "digest LABEL SHA1" per result (for the comparison with the engine thread alone).

Run with COLLECTIVES_LATENCY_STAGES=1 to have the engine report how many cycles callers ran.
"""
import hashlib
import sys
import threading
import time

import numpy as np

import collectives as hvd
from common import Checker, rank_input

THREADS = 3
STEPS = 40
SEQUENTIAL_STEPS = 30
# Element counts: carried by the negotiation (<= 4 KiB), fused, shared memory (8-512 KiB), MPI.
COUNTS = [1, 300, 5000, 40000, 200001]
DTYPES = [np.int32, np.float64, np.int8]

hvd.init()
RANK, SIZE = hvd.rank(), hvd.size()
checker = Checker(RANK)
digests = {}
digest_lock = threading.Lock()


def check(label, fn):
    with digest_lock:  # Checker counts without a lock of its own
        checker.check(label, fn)


def record(label, array):
    with digest_lock:
        digests[label] = hashlib.sha1(np.ascontiguousarray(array).tobytes()).hexdigest()


def inputs(seed, shape, dtype):
    return [rank_input(seed, r, shape, dtype) for r in range(SIZE)]


def pause(step, thread):
    # Different on every rank and thread: who arrives first changes from step to step.
    delay = ((step * 7 + thread * 3 + RANK * 5) % 11) * 50e-6
    if delay:
        time.sleep(delay)


def sync_thread(t):
    for step in range(STEPS):
        count = COUNTS[(step + t) % len(COUNTS)]
        dtype = DTYPES[(step + 2 * t) % len(DTYPES)]
        seed = 1000 * t + step
        label = f"t{t}.s{step}"
        mine = rank_input(seed, RANK, (count,), dtype)
        pause(step, t)
        kind = step % 4
        if kind == 0:
            got = hvd.allreduce(mine, op=hvd.Sum, name=f"ar.{label}")
            want = np.stack(inputs(seed, (count,), dtype)).sum(axis=0, dtype=dtype)
        elif kind == 1:
            buf = mine.copy()
            hvd.allreduce_(buf, op=hvd.Max, name=f"ar_.{label}")
            got, want = buf, np.stack(inputs(seed, (count,), dtype)).max(axis=0)
        elif kind == 2:
            rows = rank_input(seed, RANK, (RANK + 1, 3), dtype)
            got = hvd.allgather(rows, name=f"ag.{label}")
            want = np.concatenate([rank_input(seed, r, (r + 1, 3), dtype) for r in range(SIZE)])
        else:
            root = step % SIZE
            got = hvd.broadcast(mine, root_rank=root, name=f"bc.{label}")
            want = rank_input(seed, root, (count,), dtype)

        def same(got=got, want=want):
            assert got.dtype == want.dtype and got.shape == want.shape, (got.dtype, got.shape, want.shape)
            np.testing.assert_array_equal(got, want)

        check(f"thread {t} step {step} kind {kind} count {count} {np.dtype(dtype).name}", same)
        record(label, got)


def async_main():
    for step in range(STEPS):
        seeds = [50000 + 10 * step + k for k in range(3)]
        bufs = [rank_input(s, RANK, (COUNTS[k + 1],), np.float64) for k, s in enumerate(seeds)]
        handles = [hvd.allreduce_async_(b, op=hvd.Sum, name=f"async.{step}.{k}") for k, b in enumerate(bufs)]
        pause(step, THREADS)
        for k in (2, 0, 1):  # out of order
            hvd.synchronize(handles[k])
        for k, s in enumerate(seeds):
            want = np.stack(inputs(s, (COUNTS[k + 1],), np.float64)).sum(axis=0)
            check(f"async step {step} tensor {k}", lambda b=bufs[k], w=want: np.testing.assert_allclose(b, w))
            record(f"async.{step}.{k}", bufs[k])


def sequential_main():
    # One thread, the same names every step (cached, carried by the negotiation), nothing else
    # in flight: the engine thread sleeps and the callers run the cycles.
    for step in range(SEQUENTIAL_STEPS):
        seed = 90000 + step
        for k, count in enumerate((1, 700)):
            got = hvd.allreduce(rank_input(seed + k, RANK, (count,), np.int64), op=hvd.Sum, name=f"seq.{k}")
            want = np.stack(inputs(seed + k, (count,), np.int64)).sum(axis=0)
            check(f"sequential step {step} tensor {k}", lambda got=got, want=want: np.testing.assert_array_equal(got, want))
            record(f"seq.{step}.{k}", got)


threads = [threading.Thread(target=sync_thread, args=(t,)) for t in range(THREADS)]
for th in threads:
    th.start()
async_main()
for th in threads:
    th.join()
sequential_main()
for label in sorted(digests):
    print(f"digest {label} {digests[label]}")
sys.stdout.flush()
hvd.shutdown()
checker.finish()
