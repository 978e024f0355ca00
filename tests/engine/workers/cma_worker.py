"""Large host allreduces against numpy references, for tests/engine/test_cross_memory_allreduce.py.

Above 512 KiB, a job on one host allreduces by cross-memory attach (csrc/algorithms/cross_memory_allreduce.h)
unless COLLECTIVES_CMA_ALLREDUCE=0; this worker runs the same cases either way. Each case prints
a digest of its result on every rank ("digest RANK LABEL HEX"): the test checks that all ranks
received bit-identical results and that integer-valued results equal the MPI path's.

Cases, on 2 ranks (one peer: a chunk is read into the output or a scratch buffer) or 3 (inputs
folded in rank order):
  * every dtype, Sum, and every other op on some dtypes, in place (allreduce_) and out of place,
    at sizes just above the threshold and at a count that is no multiple of the 128 KiB chunk;
  * random float32 and float64 values (rounding differs by order: every rank must still get the
    same bits) against a float64 reference;
  * a fused group of large tensors, and 40 back-to-back async allreduces of 1 MiB with distinct
    values (the counters of alternate calls are reused);
  * a joined rank contributing zeros.
"""
import hashlib
import sys
import zlib

import numpy as np

import collectives as hvd
from common import ALL_DTYPES, BFLOAT16, Checker, rank_input

R = S = None
chk = None
THRESHOLD = 512 * 1024
CHUNK = 128 * 1024
OPS = {"Sum": hvd.Sum, "Average": hvd.Average, "Min": hvd.Min, "Max": hvd.Max, "Product": hvd.Product}
TOLERANCE = {"float16": 1e-2, "bfloat16": 2e-2, "float32": 1e-6, "float64": 1e-12}


def digest(label, arr):
    # One write per line: lines of several ranks can still run together in mpirun's stream.
    sys.stdout.write(f"digest {R} {label} {hashlib.sha1(np.ascontiguousarray(arr).tobytes()).hexdigest()}\n")
    sys.stdout.flush()


def inputs(label, shape, dt, low=-8, high=8):
    return [rank_input(zlib.crc32(label.encode()), r, shape, dt, low, high) for r in range(S)]


def reference(xs, dt, op):
    dt = np.dtype(dt)
    if dt == np.bool_:
        stack = np.stack(xs)
        return stack.all(axis=0) if op == hvd.Min else stack.any(axis=0)
    stack = np.stack([x.astype(np.float64) for x in xs])
    out = {hvd.Sum: stack.sum, hvd.Average: stack.sum, hvd.Min: stack.min, hvd.Max: stack.max,
           hvd.Product: stack.prod}[op](axis=0)
    if op == hvd.Average:
        out = np.trunc(out / S) if dt.kind in "iu" else out / S
    return out


def assert_close(got, expected, dt, what):
    assert got.dtype == np.dtype(dt) and got.shape == expected.shape, f"{what}: {got.dtype} {got.shape}"
    tol = TOLERANCE.get(np.dtype(dt).name, 0)
    np.testing.assert_allclose(got.astype(np.float64), expected.astype(np.float64), rtol=tol, atol=tol, err_msg=what)


def counts(dt):
    """Just above the threshold, and a count that leaves a partial last chunk."""
    just_above = THRESHOLD // dt.itemsize + 1
    return (just_above, 5 * CHUNK // dt.itemsize + 77)


def dtype_cases():
    for dt in ALL_DTYPES:
        for opname, op in OPS.items():
            if dt == np.bool_ and op not in (hvd.Min, hvd.Max):
                continue
            if opname != "Sum" and dt.name not in ("float32", "int32", "float64", "bool"):
                continue
            low, high = (-2, 3) if op == hvd.Product else (-8, 8)
            for n in counts(dt):
                for in_place in (False, True):
                    label = f"{dt.name} {opname} n={n} {'in place' if in_place else 'out of place'}"

                    def one(label=label, n=n, dt=dt, op=op, low=low, high=high, in_place=in_place):
                        xs = inputs(label, (n,), dt, low, high)
                        if in_place:
                            got = xs[R].copy()
                            hvd.allreduce_(got, op=op, name=label)
                        else:
                            mine = xs[R].copy()
                            got = hvd.allreduce(mine, op=op, name=label)
                            assert np.array_equal(mine, xs[R]), f"{label}: the input changed"
                        assert_close(got, reference(xs, dt, op), dt, label)
                        digest(label, got)

                    chk.check(label, one)


def random_cases():
    for dt in (np.dtype(np.float32), np.dtype(np.float64)) + ((BFLOAT16,) if BFLOAT16 is not None else ()):
        label = f"random {dt.name}"

        def one(label=label, dt=dt):
            n = 3 * 1024 * 1024 // dt.itemsize + 5
            xs = [np.random.default_rng([zlib.crc32(label.encode()), r]).standard_normal(n).astype(dt)
                  for r in range(S)]
            got = hvd.allreduce(xs[R], op=hvd.Sum, name=label)
            tol = {"float32": 1e-5, "float64": 1e-12, "bfloat16": 5e-2}[dt.name]
            np.testing.assert_allclose(got.astype(np.float64), reference(xs, dt, hvd.Sum), rtol=tol, atol=tol,
                                       err_msg=label)
            digest(label, got)

        chk.check(label, one)


def fused_and_repeated_cases():
    def fused():
        shapes = [(300_000,), (257, 1031), (140_000,)]
        xss = [inputs(f"fused.{i}", s, np.float32) for i, s in enumerate(shapes)]
        got = hvd.grouped_allreduce([xs[R] for xs in xss], op=hvd.Sum, name="fused")
        for i, (g, xs) in enumerate(zip(got, xss)):
            assert_close(g, reference(xs, np.float32, hvd.Sum), np.float32, f"fused tensor {i}")
            digest(f"fused.{i}", g)

    def repeated():
        n = (1 << 20) // 4
        xss = [inputs(f"repeat.{k}", (n,), np.float32) for k in range(40)]
        handles = [hvd.allreduce_async(xs[R], op=hvd.Sum, name=f"repeat.{k}") for k, xs in enumerate(xss)]
        for k, (h, xs) in enumerate(zip(handles, xss)):
            assert_close(hvd.synchronize(h), reference(xs, np.float32, hvd.Sum), np.float32, f"repeat {k}")

    chk.check("fused group of large tensors", fused)
    chk.check("40 async allreduces of 1 MiB", repeated)


def join_case():
    label = "joined rank contributes zeros"

    def one():
        dt = np.dtype(np.float32)
        xs = inputs(label, (400_000,), dt)
        last = S - 1
        if R != last:
            got = hvd.allreduce(xs[R], op=hvd.Sum, name=label)
            assert_close(got, reference(xs[:last], dt, hvd.Sum), dt, label)
        assert 0 <= hvd.join() < S

    chk.check(label, one)


def main():
    global R, S, chk
    hvd.init()
    R, S = hvd.rank(), hvd.size()
    chk = Checker(R)
    dtype_cases()
    random_cases()
    fused_and_repeated_cases()
    join_case()
    hvd.barrier()
    chk.finish()


if __name__ == "__main__":
    sys.exit(main())
