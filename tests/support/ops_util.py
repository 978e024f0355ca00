"""Shared helpers of the ops_worker.py families (tests/engine/workers/ops_*_checks.py): the rank
state, per-rank inputs, numpy references, assertions and the ``case`` decorator.

``ctx.R``, ``ctx.S`` (this rank and the number of ranks) and ``ctx.chk`` (the Checker) are set by
ops_worker.py after init(); helpers read them at call time, and each family function binds
``R, S = ctx.R, ctx.S`` on entry.
"""
import types
import zlib

import numpy as np

import collectives as hvd
from common import ALL_DTYPES, BFLOAT16, rank_input

OPS = {"Sum": hvd.Sum, "Average": hvd.Average, "Min": hvd.Min, "Max": hvd.Max, "Product": hvd.Product}
BOOL = np.dtype(np.bool_)
F16, F32, F64 = np.dtype(np.float16), np.dtype(np.float32), np.dtype(np.float64)
I8, I32, U8, I64 = np.dtype(np.int8), np.dtype(np.int32), np.dtype(np.uint8), np.dtype(np.int64)
INT_DTYPES = [d for d in ALL_DTYPES if d.kind in "iu"]
FLOAT_DTYPES = [d for d in ALL_DTYPES if d.kind == "f" or (BFLOAT16 is not None and d == BFLOAT16)]
NUMERIC_DTYPES = INT_DTYPES + FLOAT_DTYPES

ctx = types.SimpleNamespace(R=None, S=None, chk=None)  # set by ops_worker.py after init()


# ---------------------------------------------------------------- helpers

def seed(label):
    return zlib.crc32(label.encode())


def all_inputs(label, shape, dtype, low=-8, high=8):
    """Every rank's input for case ``label`` (shape may be a callable of the rank)."""
    return [rank_input(seed(label), r, shape(r) if callable(shape) else shape, dtype, low, high)
            for r in range(ctx.S)]


def is_int(dt):
    return np.dtype(dt).kind in "iu"


def prescaled(x, dt, factor):
    v = np.asarray(x).astype(np.float64)
    if factor != 1.0:
        v = v * factor
        if is_int(dt):
            v = np.trunc(v)  # computed in double, truncated toward zero
    return v


def ref_reduce(inputs, dt, op, pre=1.0, post=1.0):
    """The numpy reference of an allreduce over ``inputs`` (one per rank), as float64 (bool for bool)."""
    dt = np.dtype(dt)
    if dt == BOOL:
        stack = np.stack([np.asarray(x) for x in inputs])
        if op == hvd.Min:
            return stack.all(axis=0)
        if op == hvd.Max:
            return stack.any(axis=0)
        raise AssertionError("bool supports only Min and Max")
    stack = np.stack([prescaled(x, dt, pre) for x in inputs])
    if op in (hvd.Sum, hvd.Average):
        r = stack.sum(axis=0)
    elif op == hvd.Min:
        r = stack.min(axis=0)
    elif op == hvd.Max:
        r = stack.max(axis=0)
    elif op == hvd.Product:
        r = stack.prod(axis=0)
    else:
        raise AssertionError(op)
    if op == hvd.Average:
        if not is_int(dt):
            return r * (post / ctx.S)
        r = np.trunc(r / len(inputs))  # C integer division: toward zero
    if post != 1.0:
        r = r * post
        if is_int(dt):
            r = np.trunc(r)
    return r


def assert_matches(got, expected, dt, shape, what="result"):
    dt = np.dtype(dt)
    assert isinstance(got, np.ndarray), f"{what}: expected a numpy array, got {type(got).__name__}"
    assert got.dtype == dt, f"{what}: dtype {got.dtype} != {dt}"
    assert got.shape == tuple(shape), f"{what}: shape {got.shape} != {tuple(shape)}"
    expected = np.asarray(expected)
    if dt == BOOL:
        np.testing.assert_array_equal(got, expected.astype(np.bool_), err_msg=what)
    elif dt == F16 or (BFLOAT16 is not None and dt == BFLOAT16):
        np.testing.assert_allclose(got.astype(np.float64), expected.astype(np.float64), rtol=1e-2, atol=1e-2,
                                   err_msg=what)
    elif dt == F32:
        np.testing.assert_allclose(got.astype(np.float64), expected.astype(np.float64), rtol=1e-5, atol=1e-5,
                                   err_msg=what)
    elif dt == F64:
        np.testing.assert_allclose(got, expected.astype(np.float64), rtol=1e-12, atol=1e-12, err_msg=what)
    else:
        np.testing.assert_array_equal(got.astype(np.int64), expected.astype(np.int64), err_msg=what)


def assert_same(got, expected, what="result"):
    """Bit-exact equality with dtype and shape (data movement ops)."""
    expected = np.asarray(expected)
    assert isinstance(got, np.ndarray), f"{what}: expected a numpy array, got {type(got).__name__}"
    assert got.dtype == expected.dtype, f"{what}: dtype {got.dtype} != {expected.dtype}"
    assert got.shape == expected.shape, f"{what}: shape {got.shape} != {expected.shape}"
    assert got.tobytes() == np.ascontiguousarray(expected).tobytes(), f"{what}: {got!r} != {expected!r}"


def expect_raises(exc, fn, *also):
    try:
        fn()
    except exc as e:
        for t in also:
            assert isinstance(e, t), f"{type(e).__name__} is not a {t.__name__}"
        return e
    raise AssertionError(f"expected {exc.__name__}")


def case(label):
    """Decorator: run the function now as one checked case."""
    def run(fn):
        ctx.chk.check(label, fn)
        return fn
    return run


def rs_rows(dim0, r):
    return dim0 // ctx.S + (1 if r < dim0 % ctx.S else 0)


def rs_block(full, dim0, r):
    start = sum(rs_rows(dim0, i) for i in range(r))
    return full[start:start + rs_rows(dim0, r)]


def dname(dt):
    return np.dtype(dt).name


# allreduce, reducescatter and grouped scaling factors per op
SCALES = {
    "Sum": [(1.0, 1.0), (0.5, 1.0), (1.0, 3.0), (3.0, 0.5)],
    "Average": [(1.0, 1.0), (0.5, 1.0), (1.0, 2.0)],
    "Min": [(1.0, 1.0), (2.0, 1.0)],
    "Max": [(1.0, 1.0), (1.0, 2.0)],
    "Product": [(1.0, 1.0), (1.0, 2.0)],
}


# rows each rank contributes to an allgather
def ag_rows(r):
    return [0, 3, 1, 2, 5][r % 5]  # rank 0 contributes no rows


# alltoall splits and the expected result
def a2a_splits(r, variant=0):
    return [(r + 2 * i + variant) % 3 for i in range(ctx.S)]


def a2a_expected(xs, splits_of):
    parts = []
    for src in range(ctx.S):
        s = splits_of(src)
        off = sum(s[:ctx.R])
        parts.append(xs[src][off:off + s[ctx.R]])
    return np.concatenate(parts), np.array([splits_of(src)[ctx.R] for src in range(ctx.S)], dtype=np.int32)
