"""Shared helpers of tf_ops_worker.py's families: the rank state, the dtypes, per-rank inputs,
numpy references, the result check and the ``case`` decorator.

``ctx.R``, ``ctx.S`` (this rank and the number of ranks) and ``ctx.chk`` (the Checker) are set by
tf_ops_worker.py's main() after init(). ``ctx`` and the framework-free helpers ``seed``, ``case`` and
``rs_rows`` are ops_util.py's (the numpy ops worker's), imported here: the state lives in a module
rather than in the worker because the worker runs as ``__main__``, and importing it by name would
load a second copy whose state was never set. Helpers read it at call time; each family binds
``R, S = ctx.R, ctx.S`` on entry.

Importing this module imports TensorFlow, so the worker imports it only after checking that
importing collectives did not.
"""
import numpy as np
import tensorflow as tf

import collectives.tensorflow as hvd
from common import BFLOAT16, assert_close_to_reference, rank_input
from ops_util import case, ctx, rs_rows, seed  # noqa: F401 - re-exported to the worker

TF_DTYPES = [tf.uint8, tf.int8, tf.int16, tf.int32, tf.int64, tf.float16, tf.bfloat16, tf.float32, tf.float64,
             tf.bool]
NP_OF = {tf.uint8: np.uint8, tf.int8: np.int8, tf.int16: np.int16, tf.int32: np.int32, tf.int64: np.int64,
         tf.float16: np.float16, tf.bfloat16: BFLOAT16, tf.float32: np.float32, tf.float64: np.float64,
         tf.bool: np.bool_}
NUMERIC = [d for d in TF_DTYPES if d != tf.bool]
FLOATS = [tf.float16, tf.bfloat16, tf.float32, tf.float64]
OPS = {"Sum": hvd.Sum, "Average": hvd.Average, "Min": hvd.Min, "Max": hvd.Max, "Product": hvd.Product}
MODES = ("eager", "function")


def inputs(label, shape, dtype, low=-8, high=8):
    """Every rank's input as (numpy float64-or-bool references, tf.Tensors)."""
    arrs = [rank_input(seed(label), r, shape(r) if callable(shape) else shape, NP_OF[dtype], low, high)
            for r in range(ctx.S)]
    refs = [a if dtype == tf.bool else a.astype(np.float64) for a in arrs]
    return refs, [tf.constant(a) for a in arrs]


def run(mode, fn, *args):
    """``fn(*args)`` eagerly, or traced into a fresh ``tf.function``."""
    return fn(*args) if mode == "eager" else tf.function(fn)(*args)


def as_ref(t):
    a = np.asarray(t)
    return a if a.dtype == np.bool_ else a.astype(np.float64)


def check(got, expected, dtype, what="result"):
    assert isinstance(got, tf.Tensor), f"{what}: expected a tf.Tensor, got {type(got).__name__}"
    assert got.dtype == dtype, f"{what}: dtype {got.dtype.name} != {dtype.name}"
    expected = np.asarray(expected)
    assert tuple(got.shape) == expected.shape, f"{what}: shape {tuple(got.shape)} != {expected.shape}"
    kind = ("bool" if dtype == tf.bool else "half" if dtype in (tf.float16, tf.bfloat16)
            else "float" if dtype.is_floating else "int")
    assert_close_to_reference(as_ref(got), expected, kind, what)


def ref_reduce(refs, dtype, op, pre=1.0, post=1.0):
    if dtype == tf.bool:
        st = np.stack(refs)
        return st.all(0) if op == hvd.Min else st.any(0)
    is_int = not dtype.is_floating
    st = np.stack(refs) * pre
    if is_int and pre != 1.0:
        st = np.trunc(st)
    r = {hvd.Sum: st.sum, hvd.Average: st.sum, hvd.Min: st.min, hvd.Max: st.max, hvd.Product: st.prod}[op](0)
    if op == hvd.Average:
        r = np.trunc(r / ctx.S) if is_int else r / ctx.S
    r = r * post
    return np.trunc(r) if is_int else r


def expect_raises(exc, fn, match=None):
    try:
        fn()
    except exc as e:
        assert match is None or match in str(e), f"message {str(e)!r} lacks {match!r}"
        return e
    raise AssertionError(f"expected {exc.__name__}")


def rs_start(dim0, r):
    return sum(rs_rows(dim0, i) for i in range(r))


def a2a_splits(label, r):
    rng = np.random.default_rng([seed(label), 1000 + r])
    return [int(v) for v in rng.integers(0, 3, size=ctx.S)]


def a2a_reference(label, refs, r):
    """What rank r receives: block r of every rank's input, in rank order, and the counts."""
    blocks, counts = [], []
    for q in range(ctx.S):
        sp = a2a_splits(label, q)
        start = sum(sp[:r])
        blocks.append(refs[q][start:start + sp[r]])
        counts.append(sp[r])
    return np.concatenate(blocks), counts
