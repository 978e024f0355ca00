"""Random mixed collectives of sizes from bytes to a few MiB, each result checked against numpy.

Every rank draws the same decisions (op, dtype, shape, root, splits, name) from a shared seed,
so each rank can compute every rank's input (common.rank_input) and hence the expected result.
Work comes in rounds of 1-4 operations submitted asynchronously before any is synchronized:
they are negotiated and fused together, and several engine buffers are alive at once.
"""
import math

import numpy as np

import collectives as hvd
from common import ALL_DTYPES, rank_input

MiB = 2**20
MAX_BYTES = 4 * MiB  # the largest input; allgather outputs are up to size() times that
# Inputs longer than this repeat one rank_input block of PERIOD elements: generating megabytes
# of random numbers per op would dominate the run. PERIOD is prime, so a part the engine
# misplaces by any power-of-two offset (a fusion offset, a split) still shows.
PERIOD = 4099
NON_BOOL = [d for d in ALL_DTYPES if d != np.bool_]
REDUCE = {hvd.Sum: np.sum, hvd.Min: np.min, hvd.Max: np.max, hvd.Product: np.prod}


def reduce_ref(arrays, op, dtype):
    """The elementwise reduction of same-shaped inputs in float64 (exact for the small integers
    used), cast back. Inputs repeat their first PERIOD elements, so only those are reduced."""
    shape = arrays[0].shape
    block = REDUCE[op](np.stack([a.ravel()[:PERIOD].astype(np.float64) for a in arrays]), axis=0).astype(dtype)
    return np.resize(block, int(np.prod(shape))).reshape(shape)


def same(actual, expected, label):
    actual = np.asarray(actual)
    assert actual.dtype == expected.dtype, f"{label}: dtype {actual.dtype} != {expected.dtype}"
    assert actual.shape == expected.shape, f"{label}: shape {actual.shape} != {expected.shape}"
    if not np.array_equal(actual, expected):
        bad = np.flatnonzero(actual.ravel() != expected.ravel())
        raise AssertionError(f"{label}: {bad.size} values differ, first at {bad[:4]}: "
                             f"{actual.ravel()[bad[:4]]} != {expected.ravel()[bad[:4]]}")


class MixedOps:
    OPS = [("allreduce", 30), ("allgather", 20), ("broadcast", 15), ("alltoall", 15), ("reducescatter", 15)]

    def __init__(self, seed, r, n):
        self.rng = np.random.default_rng(seed)  # identical on every rank
        self.r, self.n = r, n
        self.case = 0
        self.slot = 0  # position in the round: names in flight together must differ

    # ------------------------------------------------------------ random decisions
    def elements(self, dtype):
        """Log-uniform in bytes from 1 to MAX_BYTES (mostly small, some MiB); now and then 0."""
        if self.rng.random() < 0.03:
            return 0
        return max(1, int(math.exp(self.rng.uniform(0, math.log(MAX_BYTES)))) // dtype.itemsize)

    def rows(self, dtype, row):
        return self.elements(dtype) // max(1, int(np.prod(row)))

    def row_shape(self):
        return () if self.rng.random() < 0.5 else (int(self.rng.integers(1, 5)),)

    def dtype(self, pool=ALL_DTYPES):
        return pool[int(self.rng.integers(len(pool)))]

    def name(self, kind):
        """Half from a small reused set (cached responses whose shapes change), half fresh."""
        if self.rng.random() < 0.5:
            return f"{kind}.{self.slot}.{int(self.rng.integers(6))}"
        return f"{kind}.fresh.{self.case}"

    def inputs(self, shape_of_rank, dtype, low=-8, high=8):
        """Every rank's input for a new case."""
        self.case += 1
        xs = []
        for p in range(self.n):
            shape = shape_of_rank(p)
            count = int(np.prod(shape))
            if count <= PERIOD:
                xs.append(rank_input(self.case, p, shape, dtype, low, high))
            else:
                xs.append(np.resize(rank_input(self.case, p, (PERIOD,), dtype, low, high), count).reshape(shape))
        return xs

    # ------------------------------------------------------------ the ops: submit, return a check
    def allreduce(self):
        dtype = self.dtype()
        count = self.elements(dtype)
        ops = [hvd.Min, hvd.Max] if dtype == np.bool_ else [hvd.Sum, hvd.Min, hvd.Max]
        if dtype != np.bool_ and count <= PERIOD:
            ops.append(hvd.Product)  # small only: products of 3 ranks' values stay exact
        op = ops[int(self.rng.integers(len(ops)))]
        low, high = (-3, 4) if op == hvd.Product else (-8, 8)
        xs = self.inputs(lambda p: (count,), dtype, low, high)
        name = self.name("allreduce")
        expected = reduce_ref(xs, op, dtype)
        label = f"allreduce {name} {dtype} {op!r} ({count},)"
        if self.rng.random() < 0.3:
            buf = xs[self.r].copy()
            handle = hvd.allreduce_async_(buf, op=op, name=name)
            return lambda: same(hvd.synchronize(handle), expected, label)
        handle = hvd.allreduce_async(xs[self.r], op=op, name=name)
        return lambda: same(hvd.synchronize(handle), expected, label)

    def allgather(self):
        dtype = self.dtype()
        row = self.row_shape()
        rows = [self.rows(dtype, row) for _ in range(self.n)]
        xs = self.inputs(lambda p: (rows[p],) + row, dtype)
        name = self.name("allgather")
        handle = hvd.allgather_async(xs[self.r], name=name)
        return lambda: same(hvd.synchronize(handle), np.concatenate(xs), f"allgather {name} rows {rows} x {row}")

    def broadcast(self):
        dtype = self.dtype()
        count = self.elements(dtype)
        root = int(self.rng.integers(self.n))
        xs = self.inputs(lambda p: (count,), dtype)
        name = self.name("broadcast")
        label = f"broadcast {name} root {root} ({count},)"
        if self.rng.random() < 0.3:
            buf = xs[self.r].copy()
            handle = hvd.broadcast_async_(buf, root, name=name)
        else:
            handle = hvd.broadcast_async(xs[self.r], root, name=name)
        return lambda: same(hvd.synchronize(handle), xs[root], label)

    def alltoall(self):
        dtype = self.dtype()
        row = self.row_shape()
        rows = self.rows(dtype, row)
        # splits[p][q]: rows rank p sends to rank q, each rank's total about `rows`.
        splits = [[int(v) for v in self.rng.multinomial(rows, [1 / self.n] * self.n)] for _ in range(self.n)]
        xs = self.inputs(lambda p: (sum(splits[p]),) + row, dtype)
        name = self.name("alltoall")
        handle = hvd.alltoall_async(xs[self.r], splits=np.array(splits[self.r]), name=name)
        pieces = [xs[p][sum(splits[p][:self.r]):sum(splits[p][:self.r + 1])] for p in range(self.n)]

        def check():
            out, received = hvd.synchronize(handle)
            assert [int(v) for v in received] == [splits[p][self.r] for p in range(self.n)], received
            same(out, np.concatenate(pieces), f"alltoall {name} splits {splits}")
        return check

    def reducescatter(self):
        dtype = self.dtype(NON_BOOL)
        op = [hvd.Sum, hvd.Min, hvd.Max][int(self.rng.integers(3))]
        row = self.row_shape()
        rows = max(1, self.rows(dtype, row))
        xs = self.inputs(lambda p: (rows,) + row, dtype)
        name = self.name("reducescatter")
        handle = hvd.reducescatter_async(xs[self.r], op=op, name=name)
        counts = [rows // self.n + (1 if p < rows % self.n else 0) for p in range(self.n)]
        start = sum(counts[:self.r])
        expected = reduce_ref(xs, op, dtype)[start:start + counts[self.r]]
        return lambda: same(hvd.synchronize(handle), expected, f"reducescatter {name} ({rows},)+{row} {op!r}")

    # ------------------------------------------------------------ rounds
    def round(self, counts):
        """Submits 1-4 random operations, then checks them in random order; returns how many."""
        names = [o for o, _ in self.OPS]
        weights = np.array([w for _, w in self.OPS], dtype=np.float64)
        checks = []
        for self.slot in range(int(self.rng.integers(1, 5))):
            choice = names[int(self.rng.choice(len(names), p=weights / weights.sum()))]
            checks.append(getattr(self, choice)())
            counts[choice] = counts.get(choice, 0) + 1
        for k in self.rng.permutation(len(checks)):
            checks[int(k)]()
        return len(checks)
