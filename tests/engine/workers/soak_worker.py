"""Soak: many cycles of mixed random collectives with checked results, and a bound on the
growth of resident memory after a warm-up.

  soak_worker.py ITERATIONS WARMUP MAX_GROWTH_MB [SEED [THREADS]]

With THREADS > 1, each rank runs that many Python threads, each with its own decision stream
(seed + thread index) and its own name prefix, all submitting concurrently: the ranks'
submissions then arrive in different orders, which negotiation must sort out by name.

Every rank draws the same stream of decisions (op, shape, dtype, name, root, splits) from a
shared seed; each rank's data comes from rank_input(case, rank, ...), so every rank can
compute every other rank's input and hence the expected result. Names are a mixture of a
small reused pool (cached responses, and signature changes of cached names) and fresh ones.
"""
import gc
import sys
import threading
import time

import numpy as np

import collectives as hvd
from common import ALL_DTYPES, BFLOAT16, Checker, rank_input
from robust_util import rss_bytes, wait

OP_TIMEOUT_S = 60
INT_KINDS = "iub"
NON_BOOL = [d for d in ALL_DTYPES if d != np.bool_]
FLOATS = [d for d in ALL_DTYPES if d.kind == "f" or d == BFLOAT16]


def reduce_ref(arrays, op, dtype):
    """Reference reduction in float64 (inputs are small integers: exact), cast back."""
    stack = np.stack([a.astype(np.float64) for a in arrays])
    if op == hvd.Sum:
        out = stack.sum(0)
    elif op == hvd.Average:
        out = stack.sum(0) / len(arrays)
    elif op == hvd.Min:
        out = stack.min(0)
    elif op == hvd.Max:
        out = stack.max(0)
    elif op == hvd.Product:
        out = stack.prod(0)
    else:
        raise ValueError(op)
    return out.astype(dtype)


def same(actual, expected, label):
    actual = np.asarray(actual)
    assert actual.dtype == expected.dtype, f"{label}: dtype {actual.dtype} != {expected.dtype}"
    assert actual.shape == expected.shape, f"{label}: shape {actual.shape} != {expected.shape}"
    if not np.array_equal(actual.astype(np.float64), expected.astype(np.float64)):
        raise AssertionError(f"{label}: values differ\nactual   {actual.ravel()[:16]}\nexpected {expected.ravel()[:16]}")


class Soak:
    def __init__(self, seed, r, n, prefix="soak"):
        self.rng = np.random.default_rng(seed)  # identical on every rank
        self.r, self.n = r, n
        self.prefix = prefix
        self.case = 0

    # ------------------------------------------------------------ random decisions
    def shape(self, ndim_min=1, min_dim0=0):
        ndim = int(self.rng.integers(ndim_min, 4))
        dims = [int(self.rng.integers(1, 5)) for _ in range(ndim)]
        if ndim and self.rng.random() < 0.05:
            dims[0] = 0  # an occasional empty tensor
        if ndim:
            dims[0] = max(dims[0], min_dim0)
        return tuple(dims)

    def dtype(self, pool=ALL_DTYPES):
        return pool[int(self.rng.integers(len(pool)))]

    def name(self, kind, it, j=0):
        if self.rng.random() < 0.5:
            return f"{self.prefix}.{kind}.{int(self.rng.integers(8))}"  # reused pool
        return f"{self.prefix}.fresh.{kind}.{it}.{j}"

    def reduce_op(self, dtype):
        if dtype == np.bool_:
            return [hvd.Min, hvd.Max][int(self.rng.integers(2))]
        ops = [hvd.Sum, hvd.Min, hvd.Max, hvd.Product]
        if dtype.kind == "f" or dtype == BFLOAT16:
            ops.append(hvd.Average)
        return ops[int(self.rng.integers(len(ops)))]

    def inputs(self, shape_of_rank, dtype, low=-8, high=8):
        """(case id, every rank's input)."""
        self.case += 1
        case = [self.case, sum(map(ord, self.prefix))]
        return [np.asarray(rank_input(case, p, shape_of_rank(p), dtype, low, high)) for p in range(self.n)]

    # ------------------------------------------------------------ the ops
    def allreduce(self, it):
        dtype = self.dtype()
        op = self.reduce_op(dtype)
        shape = self.shape(ndim_min=0)
        low, high = (-3, 4) if op == hvd.Product else (-8, 8)
        xs = self.inputs(lambda p: shape, dtype, low, high)
        scale = 1.0
        if op in (hvd.Sum, hvd.Average) and (dtype.kind == "f" or dtype == BFLOAT16) and self.rng.random() < 0.3:
            scale = 2.0
        name = self.name("allreduce", it)
        inplace = self.rng.random() < 0.3
        if inplace:
            buf = xs[self.r].copy()
            out = wait(hvd.allreduce_async_(buf, op=op, name=name, postscale_factor=scale), OP_TIMEOUT_S, name)
            assert out is buf
        else:
            out = wait(hvd.allreduce_async(xs[self.r], op=op, name=name, postscale_factor=scale), OP_TIMEOUT_S, name)
        expected = reduce_ref(xs, op, dtype)
        if scale != 1.0:
            expected = (expected.astype(np.float64) * scale).astype(dtype)
        same(out, expected, f"allreduce {name} {dtype} {op!r} {shape}")

    def allreduce_batch(self, it):
        """Several async allreduces in flight at once (fusion), synchronized in random order."""
        k = int(self.rng.integers(2, 7))
        pending = []
        for j in range(k):
            dtype = self.dtype(NON_BOOL)
            op = [hvd.Sum, hvd.Max][int(self.rng.integers(2))]
            shape = self.shape()
            xs = self.inputs(lambda p: shape, dtype)
            name = self.name("batch", it, j) + f".{j}"
            pending.append((name, hvd.allreduce_async(xs[self.r], op=op, name=name), reduce_ref(xs, op, dtype)))
        for idx in self.rng.permutation(k):
            name, handle, expected = pending[int(idx)]
            same(wait(handle, OP_TIMEOUT_S, name), expected, f"batched allreduce {name}")

    def grouped(self, it):
        dtype = self.dtype(NON_BOOL)
        k = int(self.rng.integers(1, 4))
        shapes = [self.shape() for _ in range(k)]
        xss = [self.inputs(lambda p, s=s: s, dtype) for s in shapes]
        name = self.name("grouped", it)
        outs = wait(hvd.grouped_allreduce_async([xs[self.r] for xs in xss], op=hvd.Sum, name=name), OP_TIMEOUT_S, name)
        assert len(outs) == k
        for out, xs in zip(outs, xss):
            same(out, reduce_ref(xs, hvd.Sum, dtype), f"grouped {name}")

    def broadcast(self, it):
        dtype = self.dtype()
        shape = self.shape(ndim_min=0)
        root = int(self.rng.integers(self.n))
        xs = self.inputs(lambda p: shape, dtype)
        name = self.name("broadcast", it)
        if self.rng.random() < 0.3:
            buf = xs[self.r].copy()
            wait(hvd.broadcast_async_(buf, root, name=name), OP_TIMEOUT_S, name)
            out = buf
        else:
            out = wait(hvd.broadcast_async(xs[self.r], root, name=name), OP_TIMEOUT_S, name)
        same(out, xs[root], f"broadcast {name} root {root}")

    def allgather(self, it):
        dtype = self.dtype()
        tail = self.shape(ndim_min=0)[:2]
        dim0 = [int(self.rng.integers(0, 4)) for _ in range(self.n)]
        xs = self.inputs(lambda p: (dim0[p],) + tail, dtype)
        name = self.name("allgather", it)
        out = wait(hvd.allgather_async(xs[self.r], name=name), OP_TIMEOUT_S, name)
        same(out, np.concatenate(xs), f"allgather {name} dims {dim0} + {tail}")

    def alltoall(self, it):
        dtype = self.dtype()
        tail = self.shape(ndim_min=0)[:2]
        if self.rng.random() < 0.3:
            per = int(self.rng.integers(0, 3))
            splits = [[per] * self.n for _ in range(self.n)]
            explicit = False
        else:
            splits = [[int(self.rng.integers(0, 3)) for _ in range(self.n)] for _ in range(self.n)]
            explicit = True
        xs = self.inputs(lambda p: (sum(splits[p]),) + tail, dtype)
        name = self.name("alltoall", it)
        handle = hvd.alltoall_async(xs[self.r], splits=np.array(splits[self.r]) if explicit else None, name=name)
        result = wait(handle, OP_TIMEOUT_S, name)
        pieces = []
        for p in range(self.n):
            start = sum(splits[p][:self.r])
            pieces.append(xs[p][start:start + splits[p][self.r]])
        expected = np.concatenate(pieces)
        # The handle resolves to (received, received_splits) with or without explicit splits.
        out, received = result
        assert [int(v) for v in received] == [splits[p][self.r] for p in range(self.n)], received
        same(out, expected, f"alltoall {name} splits {splits}")

    def reducescatter(self, it):
        dtype = self.dtype(NON_BOOL)
        op = [hvd.Sum, hvd.Min, hvd.Max][int(self.rng.integers(3))]
        shape = self.shape(ndim_min=1)
        xs = self.inputs(lambda p: shape, dtype)
        name = self.name("reducescatter", it)
        out = wait(hvd.reducescatter_async(xs[self.r], op=op, name=name), OP_TIMEOUT_S, name)
        dim0 = shape[0]
        rows = [dim0 // self.n + (1 if p < dim0 % self.n else 0) for p in range(self.n)]
        start = sum(rows[:self.r])
        expected = reduce_ref(xs, op, dtype)[start:start + rows[self.r]]
        same(out, expected, f"reducescatter {name} {shape} {op!r}")

    OPS = [("allreduce", 30), ("allreduce_batch", 10), ("grouped", 5), ("broadcast", 15), ("allgather", 15),
           ("alltoall", 12), ("reducescatter", 13)]

    def step(self, it):
        names = [o for o, _ in self.OPS]
        weights = np.array([w for _, w in self.OPS], dtype=np.float64)
        choice = names[int(self.rng.choice(len(names), p=weights / weights.sum()))]
        getattr(self, choice)(it)
        return choice


def main():
    iterations, warmup, max_growth_mb = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3])
    seed = int(sys.argv[4]) if len(sys.argv) > 4 else 20240611
    threads = int(sys.argv[5]) if len(sys.argv) > 5 else 1
    hvd.init()
    r, n = hvd.rank(), hvd.size()
    chk = Checker(r)
    soaks = [Soak(seed + t, r, n, prefix=f"soak{t}" if threads > 1 else "soak") for t in range(threads)]
    counts = {}
    errors = []
    lock = threading.Lock()
    start = time.monotonic()

    def run_range(soak, first, last):
        try:
            for it in range(first, last):
                try:
                    choice = soak.step(it)
                except AssertionError as e:
                    raise AssertionError(f"{soak.prefix} iteration {it}: {e}") from None
                with lock:
                    counts[choice] = counts.get(choice, 0) + 1
        except BaseException as e:  # noqa: BLE001 - reported by the main thread
            with lock:
                errors.append(e)

    def phase(first, last):
        if threads == 1:
            run_range(soaks[0], first, last)
        else:
            workers = [threading.Thread(target=run_range, args=(s, first, last), daemon=True) for s in soaks]
            for w in workers:
                w.start()
            for w in workers:
                w.join()
        if errors:
            raise errors[0]

    baseline = []

    def warm():
        phase(0, warmup)
        gc.collect()
        baseline.append(rss_bytes())
    chk.check(f"{warmup} warm-up iterations x {threads} thread(s)", warm)
    if baseline:
        chk.check(f"{iterations - warmup} more iterations x {threads} thread(s)", lambda: phase(warmup, iterations))
    elapsed = time.monotonic() - start

    def memory_bounded():
        gc.collect()
        end = rss_bytes()
        growth = (end - baseline[0]) / 2**20
        print(f"[rank {r}] RSS after warm-up {baseline[0] / 2**20:.1f} MiB, at the end {end / 2**20:.1f} MiB "
              f"(+{growth:.1f} MiB)", flush=True)
        assert growth < max_growth_mb, f"resident memory grew by {growth:.1f} MiB after the warm-up"
    if baseline and not errors:
        chk.check("resident memory bounded", memory_bounded)
    print(f"[rank {r}] {sum(counts.values())} iterations in {elapsed:.1f} s: {counts}", flush=True)
    hvd.shutdown()
    chk.finish()


if __name__ == "__main__":
    main()
