"""Correctness of every collective against numpy references (run under mpirun, one process per rank).

Usage: ops_worker.py FAMILY [FAMILY ...]

Every rank recomputes every other rank's input with ``rank_input`` and checks its own result
against a numpy reference. All ranks run the same cases in the same order (so automatic
names agree); failures are collected by ``Checker`` and reported at the end, and the process
exits non-zero if any case failed on this rank.
"""
import array
import sys
import time
import zlib

import numpy as np

import collectives as hvd
from common import ALL_DTYPES, BFLOAT16, Checker, rank_input

OPS = {"Sum": hvd.Sum, "Average": hvd.Average, "Min": hvd.Min, "Max": hvd.Max, "Product": hvd.Product}
BOOL = np.dtype(np.bool_)
F16, F32, F64 = np.dtype(np.float16), np.dtype(np.float32), np.dtype(np.float64)
I8, I32, U8, I64 = np.dtype(np.int8), np.dtype(np.int32), np.dtype(np.uint8), np.dtype(np.int64)
INT_DTYPES = [d for d in ALL_DTYPES if d.kind in "iu"]
FLOAT_DTYPES = [d for d in ALL_DTYPES if d.kind == "f" or (BFLOAT16 is not None and d == BFLOAT16)]
NUMERIC_DTYPES = INT_DTYPES + FLOAT_DTYPES

R = S = None  # this rank and the number of ranks, set after init()
chk = None


# ---------------------------------------------------------------- helpers

def seed(label):
    return zlib.crc32(label.encode())


def all_inputs(label, shape, dtype, low=-8, high=8):
    """Every rank's input for case ``label`` (shape may be a callable of the rank)."""
    return [rank_input(seed(label), r, shape(r) if callable(shape) else shape, dtype, low, high) for r in range(S)]


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
            return r * (post / S)
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
        chk.check(label, fn)
        return fn
    return run


def rs_rows(dim0, r):
    return dim0 // S + (1 if r < dim0 % S else 0)


def rs_block(full, dim0, r):
    start = sum(rs_rows(dim0, i) for i in range(r))
    return full[start:start + rs_rows(dim0, r)]


def dname(dt):
    return np.dtype(dt).name


# ---------------------------------------------------------------- allreduce: dtypes x ops x scaling

SCALES = {
    "Sum": [(1.0, 1.0), (0.5, 1.0), (1.0, 3.0), (3.0, 0.5)],
    "Average": [(1.0, 1.0), (0.5, 1.0), (1.0, 2.0)],
    "Min": [(1.0, 1.0), (2.0, 1.0)],
    "Max": [(1.0, 1.0), (1.0, 2.0)],
    "Product": [(1.0, 1.0), (1.0, 2.0)],
}


def fam_allreduce():
    for dt in ALL_DTYPES:
        for opname, op in OPS.items():
            if dt == BOOL and opname not in ("Min", "Max"):
                label = f"allreduce bool {opname} raises UnsupportedTypeError"

                @case(label)
                def _():
                    x = all_inputs(label, (4,), dt)[R]
                    expect_raises(hvd.UnsupportedTypeError, lambda: hvd.allreduce(x, op=op, name=label + ".a"),
                                  TypeError)
                    expect_raises(hvd.UnsupportedTypeError, lambda: hvd.allreduce_async(x, op=op, name=label + ".b"),
                                  TypeError)
                    expect_raises(hvd.UnsupportedTypeError, lambda: hvd.allreduce_(x, op=op, name=label + ".c"),
                                  TypeError)
                    expect_raises(hvd.UnsupportedTypeError,
                                  lambda: hvd.grouped_allreduce([x.astype(np.float32), x], op=op, name=label + ".d"),
                                  TypeError)
                continue
            scales = [(1.0, 1.0)] if dt == BOOL else SCALES[opname]
            low, high = (-2, 3) if opname == "Product" else (-8, 8)
            for pre, post in scales:
                for shape in ((3, 5), (17,)):
                    label = f"allreduce {dname(dt)} {opname} pre={pre} post={post} shape={shape}"

                    @case(label)
                    def _():
                        xs = all_inputs(label, shape, dt, low, high)
                        x = xs[R].copy()
                        got = hvd.allreduce(x, op=op, name=label, prescale_factor=pre, postscale_factor=post)
                        assert_matches(got, ref_reduce(xs, dt, op, pre, post), dt, shape)
                        assert_same(x, xs[R], "input after allreduce")

            # In place, and async + poll + synchronize.
            scales_ip = [(1.0, 1.0)] if dt == BOOL else [SCALES[opname][-1]]
            for pre, post in scales_ip:
                label = f"allreduce_ {dname(dt)} {opname} pre={pre} post={post}"

                @case(label)
                def _():
                    xs = all_inputs(label, (2, 3, 4), dt, low, high)
                    x = xs[R].copy()
                    ret = hvd.allreduce_(x, op=op, name=label, prescale_factor=pre, postscale_factor=post)
                    assert ret is x, "allreduce_ must return its argument"
                    assert_matches(x, ref_reduce(xs, dt, op, pre, post), dt, (2, 3, 4))

                label = f"allreduce_async {dname(dt)} {opname}"

                @case(label)
                def _():
                    xs = all_inputs(label, (7,), dt, low, high)
                    h = hvd.allreduce_async(xs[R], op=op, name=label)
                    y = xs[R].copy()
                    h2 = hvd.allreduce_async_(y, op=op, name=label + ".inplace")
                    deadline = time.time() + 60
                    while not (hvd.poll(h) and hvd.poll(h2)):
                        assert time.time() < deadline, "poll never became true"
                        time.sleep(0.001)
                    exp = ref_reduce(xs, dt, op)
                    assert_matches(hvd.synchronize(h), exp, dt, (7,))
                    assert hvd.synchronize(h2) is y
                    assert_matches(y, exp, dt, (7,))

    label = "allreduce default op is Average"

    @case(label)
    def _():
        for dt in (F32, I32, F64):
            xs = all_inputs(label + dname(dt), (9,), dt)
            assert_matches(hvd.allreduce(xs[R]), ref_reduce(xs, dt, hvd.Average), dt, (9,), f"default op {dt}")

    label = "integer Average truncates toward zero"

    @case(label)
    def _():
        # Rank 0 contributes -7, the others 0 (sum -7), then 7; and a mix.
        for dt in (I8, np.dtype(np.int16), I32, I64):
            x = np.array([-7 if R == 0 else 0, 7 if R == 0 else 0, -1, 1 if R == S - 1 else -1], dtype=dt)
            got = hvd.allreduce(x, op=hvd.Average, name=f"{label}.{dname(dt)}")
            sums = [-7, 7, -S, -(S - 1) + 1]
            exp = [int(s / S) for s in sums]  # Python int(float) truncates toward zero
            assert got.tolist() == exp, (dt, got.tolist(), exp)

    label = "integer prescale truncates toward zero"

    @case(label)
    def _():
        for dt in (I8, I32, I64):
            x = np.array([-7, 7, -3, 3, -1, 1, 5], dtype=dt)
            got = hvd.allreduce(x, op=hvd.Sum, name=f"{label}.{dname(dt)}", prescale_factor=0.5)
            exp = [S * v for v in (-3, 3, -1, 1, 0, 0, 2)]
            assert got.tolist() == exp, (dt, got.tolist(), exp)

    label = "unnamed allreduces"

    @case(label)
    def _():
        for i in range(5):
            xs = all_inputs(f"{label}.{i}", (6,), F32)
            assert_matches(hvd.allreduce(xs[R], op=hvd.Sum), ref_reduce(xs, F32, hvd.Sum), F32, (6,))
            y = xs[R].copy()
            hvd.allreduce_(y, op=hvd.Max)
            assert_matches(y, ref_reduce(xs, F32, hvd.Max), F32, (6,))


# ---------------------------------------------------------------- odd sizes, zero-size and 0-d tensors

def fam_shapes():
    for dt in (F32, I32, F16, U8, F64):
        for n in (1, 3, 17, 1001):
            for opname in ("Sum", "Average", "Max"):
                op = OPS[opname]
                label = f"allreduce size {n} {dname(dt)} {opname}"

                @case(label)
                def _():
                    xs = all_inputs(label, (n,), dt)
                    got = hvd.allreduce(xs[R], op=op, name=label)
                    assert_matches(got, ref_reduce(xs, dt, op), dt, (n,))

    for dt in (F32, I64, BOOL):
        for shape in ((0,), (0, 3), (3, 0, 2)):
            label = f"zero-size {dname(dt)} {shape}"

            @case(label)
            def _():
                x = np.zeros(shape, dtype=dt)
                op = hvd.Max if dt == BOOL else hvd.Sum
                assert_same(hvd.allreduce(x, op=op, name=label + ".ar"), x, "allreduce")
                y = x.copy()
                assert hvd.allreduce_(y, op=op, name=label + ".ar_") is y
                assert_same(hvd.grouped_allreduce([x, x.copy()], op=op, name=label + ".grp")[1], x, "grouped")
                for root in range(S):
                    assert_same(hvd.broadcast(x, root, name=f"{label}.bc{root}"), x, "broadcast")
                    z = x.copy()
                    assert hvd.broadcast_(z, root, name=f"{label}.bc_{root}") is z
                dim0 = shape[0]
                assert_same(hvd.allgather(x, name=label + ".ag"), np.concatenate([x] * S), "allgather")
                if dim0 % S == 0:
                    assert_same(hvd.alltoall(x, name=label + ".a2a"), x, "alltoall")
                # every rank sends all its rows to the next rank
                splits = [dim0 if i == (R + 1) % S else 0 for i in range(S)]
                out, rsplits = hvd.alltoall(x, splits=splits, name=label + ".a2a_splits")
                assert_same(out, x, "alltoall with splits")
                assert_same(rsplits, np.array([dim0 if i == (R - 1) % S else 0 for i in range(S)], np.int32),
                            "received_splits")
                rs = hvd.reducescatter(x, op=op, name=label + ".rs")
                assert_same(rs, np.zeros((rs_rows(dim0, R),) + shape[1:], dt), "reducescatter")

    label = "large tensors"

    @case(label)
    def _():
        # Large enough for MPI's segmented / reduce-scatter based algorithms, including the
        # user-defined float16 and bfloat16 reductions.
        n = 300_001
        for dt in [F16, F32, I32] + ([BFLOAT16] if BFLOAT16 is not None else []):
            for opname in ("Sum", "Average", "Max"):
                op = OPS[opname]
                xs = all_inputs(f"{label}{dname(dt)}{opname}", (n,), dt)
                got = hvd.allreduce(xs[R], op=op, name=f"{label}.{dname(dt)}.{opname}")
                assert_matches(got, ref_reduce(xs, dt, op), dt, (n,), f"large allreduce {dname(dt)} {opname}")
            dim0 = 50_001
            xs = all_inputs(f"{label}{dname(dt)}rs", (dim0, 3), dt)
            got = hvd.reducescatter(xs[R], op=hvd.Sum, name=f"{label}.{dname(dt)}.rs")
            assert_matches(got, rs_block(ref_reduce(xs, dt, hvd.Sum), dim0, R), dt, (rs_rows(dim0, R), 3),
                           f"large reducescatter {dname(dt)}")
        xs = all_inputs(label + "ag", lambda r: (40_000 * (r + 1) + r, 3), F32)
        assert_same(hvd.allgather(xs[R], name=label + ".ag"), np.concatenate(xs), "large allgather")
        ys = all_inputs(label + "a2a", lambda r: (S * 20_000 + 3, 2), F64)
        splits_of = lambda r: [20_000] * (S - 1) + [20_003]  # noqa: E731
        out, rsplits = hvd.alltoall(ys[R], splits=splits_of(R), name=label + ".a2a")
        exp_out, exp_splits = a2a_expected(ys, splits_of)
        assert_same(out, exp_out, "large alltoall")
        assert_same(rsplits, exp_splits, "large alltoall received_splits")

    for dt in (F32, I32, F64, BOOL):
        label = f"0-d tensors {dname(dt)}"
        xs = all_inputs(label, (), dt)
        op = hvd.Max if dt == BOOL else hvd.Sum

        @case(label + " allreduce keeps shape ()")
        def _():
            got = hvd.allreduce(xs[R], op=op, name=f"{label}.ar")
            assert_matches(got, ref_reduce(xs, dt, op), dt, (), "0-d allreduce")

        @case(label + " allreduce_")
        def _():
            y = xs[R].copy()
            assert hvd.allreduce_(y, op=op, name=f"{label}.ar_") is y
            assert_matches(y, ref_reduce(xs, dt, op), dt, (), "0-d allreduce_")

        @case(label + " broadcast keeps shape ()")
        def _():
            for root in range(S):
                assert_same(hvd.broadcast(xs[R], root, name=f"{label}.bc.{root}"), xs[root], "0-d broadcast")

        @case(label + " broadcast_")
        def _():
            for root in range(S):
                y = xs[R].copy()
                assert hvd.broadcast_(y, root, name=f"{label}.bc_.{root}") is y
                assert_same(y, xs[root], "0-d broadcast_")

        @case(label + " allgather as shape (1,)")
        def _():
            got = hvd.allgather(xs[R], name=f"{label}.ag")
            assert_same(got, np.stack(xs).reshape(S), "0-d allgather")

    label = "scalars"

    @case(label + " allgather of a Python int")
    def _():
        got = hvd.allgather(R, name=f"{label}.pyint")
        assert isinstance(got, np.ndarray) and got.tolist() == list(range(S)), repr(got)

    @case(label + " come back as 0-d numpy arrays")
    def _():
        got = hvd.allreduce(np.float32(1.5), op=hvd.Sum, name=f"{label}.npscalar")
        assert_matches(got, np.float64(1.5 * S), F32, (), "numpy scalar allreduce")
        got = hvd.allreduce(2.0, op=hvd.Sum, name=f"{label}.pyfloat")
        assert_matches(got, np.float64(2.0 * S), F64, (), "Python float allreduce")
        got = hvd.broadcast(np.float64(R + 0.25), S - 1, name=f"{label}.npscalar.bc")
        assert_matches(got, np.float64(S - 1 + 0.25), F64, (), "numpy scalar broadcast")

    label = "reducescatter of a 0-d tensor raises"

    @case(label)
    def _():
        expect_raises(hvd.InvalidArgumentError, lambda: hvd.reducescatter(np.float32(1), name=label), ValueError)


# ---------------------------------------------------------------- non-contiguous inputs

VIEWS = {
    "step": lambda a: a[::2],
    "T": lambda a: a.T,
    "slice2d": lambda a: a[1::2, ::3],
    "fortran": np.asfortranarray,
    "negstride": lambda a: a[::-1, ::-2],
}


def inplace_target(vname, x):
    """(base, view): the array whose memory an in-place op on the view changes. For
    "fortran" the whole Fortran-ordered array is the (non-C-contiguous) target."""
    base = x.copy()
    if vname == "fortran":
        base = np.asfortranarray(base)
        return base, base
    return base, VIEWS[vname](base)


def expected_base(vname, x, new_values):
    """``x`` with the view's elements replaced by ``new_values``."""
    if vname == "fortran":
        return np.asarray(new_values)
    e = x.copy()
    VIEWS[vname](e)[...] = new_values
    return e


def fam_noncontig():
    for vname, view in VIEWS.items():
        for dt in (F32, I32, F16, BOOL):
            op = hvd.Max if dt == BOOL else hvd.Sum
            label = f"noncontig {vname} {dname(dt)}"

            @case(label + " allreduce")
            def _():
                xs = all_inputs(label + "ar", (8, 9), dt)
                vs = [view(x) for x in xs]
                got = hvd.allreduce(vs[R], op=op, name=label + ".ar")
                assert_matches(got, ref_reduce(vs, dt, op), dt, vs[R].shape)
                assert_same(xs[R], all_inputs(label + "ar", (8, 9), dt)[R], "input after allreduce")

            @case(label + " allreduce_")
            def _():
                xs = all_inputs(label + "ar_", (8, 9), dt)
                base, v = inplace_target(vname, xs[R])
                ret = hvd.allreduce_(v, op=op, name=label + ".ar_")
                assert ret is v, "allreduce_ must return its argument"
                red = ref_reduce([view(x) for x in xs], dt, op)
                assert_matches(v, red, dt, v.shape, "view after allreduce_")
                assert_matches(base, expected_base(vname, xs[R], red), dt, base.shape,
                               "whole array after allreduce_ of a view")

            @case(label + " broadcast")
            def _():
                xs = all_inputs(label + "bc", (8, 9), dt)
                for root in range(S):
                    got = hvd.broadcast(view(xs[R]), root, name=f"{label}.bc.{root}")
                    assert_same(got, np.ascontiguousarray(view(xs[root])), f"broadcast from {root}")
                    base, v = inplace_target(vname, xs[R])
                    ret = hvd.broadcast_(v, root, name=f"{label}.bc_.{root}")
                    assert ret is v
                    assert_same(np.ascontiguousarray(v), np.ascontiguousarray(view(xs[root])),
                                f"view after broadcast_ from {root}")
                    assert_same(np.ascontiguousarray(base),
                                np.ascontiguousarray(expected_base(vname, xs[R], view(xs[root]))),
                                f"whole array after broadcast_ of a view from {root}")

            @case(label + " grouped")
            def _():
                xs = all_inputs(label + "grp", (8, 9), dt)
                ys = all_inputs(label + "grp2", (6, 4), dt)
                got = hvd.grouped_allreduce([view(xs[R]), view(ys[R])], op=op, name=label + ".grp")
                assert_matches(got[0], ref_reduce([view(x) for x in xs], dt, op), dt, view(xs[R]).shape)
                assert_matches(got[1], ref_reduce([view(y) for y in ys], dt, op), dt, view(ys[R]).shape)
                bx, vx = inplace_target(vname, xs[R])
                by, vy = inplace_target(vname, ys[R])
                ret = hvd.grouped_allreduce_([vx, vy], op=op, name=label + ".grp_")
                assert ret[0] is vx and ret[1] is vy
                rx = ref_reduce([view(x) for x in xs], dt, op)
                ry = ref_reduce([view(y) for y in ys], dt, op)
                assert_matches(vx, rx, dt, vx.shape, "grouped_allreduce_ first view")
                assert_matches(vy, ry, dt, vy.shape, "grouped_allreduce_ second view")
                assert_matches(bx, expected_base(vname, xs[R], rx), dt, bx.shape, "grouped_allreduce_ first base")
                assert_matches(by, expected_base(vname, ys[R], ry), dt, by.shape, "grouped_allreduce_ second base")

        label = f"noncontig {vname} read-only view in place raises"

        @case(label)
        def _():
            ro = view(np.zeros((8, 9), np.float32))
            ro = np.broadcast_to(ro, ro.shape)  # read-only
            expect_raises(hvd.InvalidArgumentError, lambda: hvd.allreduce_(ro, name=label + ".ar_"), ValueError)
            expect_raises(hvd.InvalidArgumentError, lambda: hvd.broadcast_(ro, 0, name=label + ".bc_"), ValueError)

        label = f"noncontig {vname} allgather/alltoall/reducescatter"

        @case(label)
        def _():
            # allgather: the view's first dimension differs per rank (rank 0 has none)
            def base_shape(r):
                return (2 * r, 5) if vname in ("step", "fortran") else ((5, r) if vname == "T" else (2 * r + 1, 9))
            xs = all_inputs(label + "ag", base_shape, F32)
            got = hvd.allgather(view(xs[R]), name=label + ".ag")
            assert_same(got, np.concatenate([view(x) for x in xs]), "allgather of a view")
            # alltoall (equal parts) and reducescatter of views of an array with 2*S*k rows
            ys = all_inputs(label + "a2a", (4 * S, 6), I32)
            vs = [view(y) for y in ys]
            d0 = vs[R].shape[0]
            if d0 % S == 0:
                k = d0 // S
                got = hvd.alltoall(vs[R], name=label + ".a2a")
                assert_same(got, np.concatenate([v[R * k:(R + 1) * k] for v in vs]), "alltoall of a view")
            splits = [(R + i) % 2 for i in range(S)]
            splits[-1] += d0 - sum(splits)
            if splits[-1] >= 0:
                all_splits = []
                for r in range(S):
                    s = [(r + i) % 2 for i in range(S)]
                    s[-1] += d0 - sum(s)
                    all_splits.append(s)
                out, rsplits = hvd.alltoall(vs[R], splits=splits, name=label + ".a2a_splits")
                exp = [vs[src][sum(all_splits[src][:R]):sum(all_splits[src][:R + 1])] for src in range(S)]
                assert_same(out, np.concatenate(exp), "alltoall with splits of a view")
                assert_same(rsplits, np.array([all_splits[src][R] for src in range(S)], np.int32), "received_splits")
            full = ref_reduce(vs, I32, hvd.Sum)
            got = hvd.reducescatter(vs[R], op=hvd.Sum, name=label + ".rs")
            assert_matches(got, rs_block(full, d0, R), I32, (rs_rows(d0, R),) + vs[R].shape[1:], "reducescatter")
            got = hvd.grouped_reducescatter([vs[R], view(xs[R])[:0]], op=hvd.Sum, name=label + ".grs")
            assert_matches(got[0], rs_block(full, d0, R), I32, (rs_rows(d0, R),) + vs[R].shape[1:],
                           "grouped_reducescatter")
            assert_same(got[1], view(xs[R])[:0], "grouped_reducescatter of an empty view")
            got = hvd.grouped_allgather([view(xs[R]), vs[R]], name=label + ".gag")
            assert_same(got[0], np.concatenate([view(x) for x in xs]), "grouped_allgather[0] of a view")
            assert_same(got[1], np.concatenate(vs), "grouped_allgather[1] of a view")


# ---------------------------------------------------------------- broadcast

def fam_broadcast():
    for dt in ALL_DTYPES:
        label = f"broadcast {dname(dt)}"

        @case(label)
        def _():
            for shape in ((11,), (3, 4, 2)):
                xs = all_inputs(f"{label}{shape}", shape, dt)
                for root in range(S):
                    x = xs[R].copy()
                    got = hvd.broadcast(x, root, name=f"{label}.{shape}.{root}")
                    assert_same(got, xs[root], f"broadcast from {root}")
                    assert_same(x, xs[R], "input after broadcast")
                    y = xs[R].copy()
                    ret = hvd.broadcast_(y, root, name=f"{label}.{shape}.inplace.{root}")
                    assert ret is y, "broadcast_ must return its argument"
                    assert_same(y, xs[root], f"broadcast_ from {root}")
                    h = hvd.broadcast_async(xs[R], root_rank=root, name=f"{label}.{shape}.async.{root}")
                    z = xs[R].copy()
                    h2 = hvd.broadcast_async_(z, root, name=f"{label}.{shape}.async_.{root}")
                    assert_same(hvd.synchronize(h), xs[root], "broadcast_async")
                    assert hvd.synchronize(h2) is z
                    assert_same(z, xs[root], "broadcast_async_")

    label = "broadcast unnamed, large, invalid root"

    @case(label)
    def _():
        xs = all_inputs(label, (1001,), F64)
        for root in range(S):
            assert_same(hvd.broadcast(xs[R], root), xs[root], "unnamed broadcast")
        xs = all_inputs(label + "big", (300, 257), F32)
        assert_same(hvd.broadcast(xs[R], S - 1, name=label + ".big"), xs[S - 1], "large broadcast")
        for bad in (S, -1):
            expect_raises(hvd.InvalidArgumentError, lambda: hvd.broadcast(xs[R], bad, name=f"{label}.bad{bad}"),
                          ValueError)
        # the engine still works afterwards
        assert_same(hvd.broadcast(xs[R], 0, name=label + ".after"), xs[0], "broadcast after an invalid root")


# ---------------------------------------------------------------- allgather

def ag_rows(r):
    return [0, 3, 1, 2, 5][r % 5]  # rank 0 contributes no rows


def fam_allgather():
    for dt in ALL_DTYPES:
        label = f"allgather {dname(dt)}"

        @case(label)
        def _():
            for tail in ((), (2, 3)):
                xs = all_inputs(f"{label}{tail}", lambda r: (ag_rows(r),) + tail, dt)
                x = xs[R].copy()
                got = hvd.allgather(x, name=f"{label}.{tail}")
                assert_same(got, np.concatenate(xs), f"allgather tail {tail}")
                assert_same(x, xs[R], "input after allgather")
                # the last rank contributes nothing this time
                ys = all_inputs(f"{label}{tail}b", lambda r: ((r + 1) % S,) + tail, dt)
                h = hvd.allgather_async(ys[R], name=f"{label}.{tail}.async")
                assert_same(hvd.synchronize(h), np.concatenate(ys), "allgather_async")

    label = "allgather same rows everywhere, all empty, unnamed, grouped"

    @case(label)
    def _():
        xs = all_inputs(label, (4, 3), F32)
        assert_same(hvd.allgather(xs[R]), np.concatenate(xs), "unnamed allgather")
        empty = np.zeros((0, 3), I32)
        assert_same(hvd.allgather(empty, name=label + ".empty"), empty, "all-empty allgather")
        a = all_inputs(label + "a", lambda r: (r + 1,), F64)
        b = all_inputs(label + "b", lambda r: (ag_rows(r), 2), I8)
        c = all_inputs(label + "c", lambda r: (2, 2), BOOL)
        got = hvd.grouped_allgather([a[R], b[R], c[R]], name=label + ".grp")
        assert isinstance(got, list) and len(got) == 3
        assert_same(got[0], np.concatenate(a), "grouped_allgather[0]")
        assert_same(got[1], np.concatenate(b), "grouped_allgather[1]")
        assert_same(got[2], np.concatenate(c), "grouped_allgather[2]")
        got = hvd.grouped_allgather([a[R], b[R]])
        assert_same(got[1], np.concatenate(b), "unnamed grouped_allgather")
        big = all_inputs(label + "big", lambda r: (100 * (r + 1), 33), F32)
        assert_same(hvd.allgather(big[R], name=label + ".big"), np.concatenate(big), "large allgather")


# ---------------------------------------------------------------- alltoall

def a2a_splits(r, variant=0):
    return [(r + 2 * i + variant) % 3 for i in range(S)]


def a2a_expected(xs, splits_of):
    parts = []
    for src in range(S):
        s = splits_of(src)
        off = sum(s[:R])
        parts.append(xs[src][off:off + s[R]])
    return np.concatenate(parts), np.array([splits_of(src)[R] for src in range(S)], dtype=np.int32)


def fam_alltoall():
    for dt in ALL_DTYPES:
        label = f"alltoall {dname(dt)}"

        @case(label)
        def _():
            for tail in ((), (3,), (2, 2)):
                k = 2
                xs = all_inputs(f"{label}{tail}", (S * k,) + tail, dt)
                x = xs[R].copy()
                got = hvd.alltoall(x, name=f"{label}.{tail}")
                assert_same(got, np.concatenate([xs[src][R * k:(R + 1) * k] for src in range(S)]),
                            f"alltoall without splits, tail {tail}")
                assert_same(x, xs[R], "input after alltoall")

                ys = all_inputs(f"{label}{tail}s", lambda r: (sum(a2a_splits(r)),) + tail, dt)
                out, rsplits = hvd.alltoall(ys[R], splits=a2a_splits(R), name=f"{label}.{tail}.splits")
                exp_out, exp_splits = a2a_expected(ys, a2a_splits)
                assert_same(out, exp_out, f"alltoall with splits, tail {tail}")
                assert_same(rsplits, exp_splits, "received_splits")

    label = "alltoall splits forms, async, unnamed"

    @case(label)
    def _():
        xs = all_inputs(label, lambda r: (sum(a2a_splits(r, 1)), 4), F32)
        exp_out, exp_splits = a2a_expected(xs, lambda r: a2a_splits(r, 1))
        forms = {"list": list, "tuple": tuple, "int64": lambda s: np.array(s, np.int64),
                 "int32": lambda s: np.array(s, np.int32)}
        for fname, form in forms.items():
            out, rsplits = hvd.alltoall(xs[R], splits=form(a2a_splits(R, 1)), name=f"{label}.{fname}")
            assert_same(out, exp_out, f"alltoall splits as {fname}")
            assert_same(rsplits, exp_splits, f"received_splits (splits as {fname})")
        h = hvd.alltoall_async(xs[R], splits=a2a_splits(R, 1), name=label + ".async")
        out, rsplits = hvd.synchronize(h)
        assert_same(out, exp_out, "alltoall_async")
        assert_same(rsplits, exp_splits, "alltoall_async received_splits")
        out, rsplits = hvd.alltoall(xs[R], a2a_splits(R, 1))
        assert_same(out, exp_out, "unnamed alltoall")
        ys = all_inputs(label + "eq", (S * 3,), I64)
        assert_same(hvd.alltoall(ys[R]), np.concatenate([y[3 * R:3 * R + 3] for y in ys]), "unnamed alltoall")
        # everything to one rank
        zs = all_inputs(label + "one", (5, 2), I32)
        splits = [5 if i == S - 1 else 0 for i in range(S)]
        out, rsplits = hvd.alltoall(zs[R], splits=splits, name=label + ".one")
        if R == S - 1:
            assert_same(out, np.concatenate(zs), "alltoall everything to the last rank")
            assert_same(rsplits, np.full(S, 5, np.int32), "received_splits")
        else:
            assert_same(out, np.zeros((0, 2), np.int32), "alltoall: nothing received")
            assert_same(rsplits, np.zeros(S, np.int32), "received_splits")

    label = "alltoall invalid splits raise InvalidArgumentError"

    @case(label)
    def _():
        x = np.arange(2 * S, dtype=np.float32).reshape(2 * S, 1)
        bad = {
            "sum too small": [1] * S if S > 2 else [1, 0],
            "sum too large": [3] * S,
            "too few": [2 * S] if S > 1 else [],
            "too many": [2] * S + [0],
            "negative": [-1] + [2] * (S - 2) + [5],
        }
        for what, splits in bad.items():
            expect_raises(hvd.InvalidArgumentError,
                          lambda: hvd.alltoall(x, splits=splits, name=f"{label}.{what}"), ValueError)
        y = np.arange(S + 1, dtype=np.float32)
        expect_raises(hvd.InvalidArgumentError, lambda: hvd.alltoall(y, name=label + ".indivisible"), ValueError)
        # the engine still works afterwards
        got = hvd.alltoall(x, name=label + ".after")
        assert_same(got, np.concatenate([x[2 * R:2 * R + 2]] * S), "alltoall after errors")


# ---------------------------------------------------------------- reducescatter

def fam_reducescatter():
    dims = sorted({2 * S + 1, S + 1, 1, S - 1, 3 * S, 0})
    for dt in (F32, I32, F64, I8):
        for opname in ("Sum", "Average"):
            op = OPS[opname]
            label = f"reducescatter {dname(dt)} {opname}"

            @case(label)
            def _():
                for dim0 in dims:
                    for tail in ((), (3,)):
                        shape = (dim0,) + tail
                        xs = all_inputs(f"{label}{shape}", shape, dt)
                        x = xs[R].copy()
                        got = hvd.reducescatter(x, op=op, name=f"{label}.{shape}")
                        exp = rs_block(ref_reduce(xs, dt, op), dim0, R)
                        assert_matches(got, exp, dt, (rs_rows(dim0, R),) + tail, f"reducescatter {shape}")
                        assert_same(x, xs[R], "input after reducescatter")

    for dt in NUMERIC_DTYPES + [BOOL]:
        for opname, op in OPS.items():
            if dt == BOOL and opname not in ("Min", "Max"):
                continue
            scales = [(1.0, 1.0)] if dt == BOOL else [(1.0, 1.0), SCALES[opname][-1]]
            low, high = (-2, 3) if opname == "Product" else (-8, 8)
            label = f"reducescatter {dname(dt)} {opname} scaled"

            @case(label)
            def _():
                dim0 = 2 * S + 1
                for pre, post in scales:
                    xs = all_inputs(f"{label}{pre}{post}", (dim0, 2), dt, low, high)
                    got = hvd.reducescatter(xs[R], op=op, name=f"{label}.{pre}.{post}", prescale_factor=pre,
                                            postscale_factor=post)
                    exp = rs_block(ref_reduce(xs, dt, op, pre, post), dim0, R)
                    assert_matches(got, exp, dt, (rs_rows(dim0, R), 2), f"pre={pre} post={post}")

    label = "reducescatter bool Sum raises, default op, async, unnamed, grouped"

    @case(label)
    def _():
        b = np.ones(S, dtype=np.bool_)
        expect_raises(hvd.UnsupportedTypeError, lambda: hvd.reducescatter(b, op=hvd.Sum, name=label + ".bool"),
                      TypeError)
        dim0 = S + 2
        xs = all_inputs(label, (dim0, 3), F32)
        assert_matches(hvd.reducescatter(xs[R], name=label + ".default"),
                       rs_block(ref_reduce(xs, F32, hvd.Average), dim0, R), F32, (rs_rows(dim0, R), 3), "default op")
        h = hvd.reducescatter_async(xs[R], op=hvd.Max, name=label + ".async")
        assert_matches(hvd.synchronize(h), rs_block(ref_reduce(xs, F32, hvd.Max), dim0, R), F32,
                       (rs_rows(dim0, R), 3), "async")
        assert_matches(hvd.reducescatter(xs[R], op=hvd.Sum), rs_block(ref_reduce(xs, F32, hvd.Sum), dim0, R),
                       F32, (rs_rows(dim0, R), 3), "unnamed")
        ys = all_inputs(label + "y", (2 * S - 1,), I32)
        got = hvd.grouped_reducescatter([xs[R], ys[R]], op=hvd.Sum, name=label + ".grp")
        assert isinstance(got, list) and len(got) == 2
        assert_matches(got[0], rs_block(ref_reduce(xs, F32, hvd.Sum), dim0, R), F32, (rs_rows(dim0, R), 3),
                       "grouped[0]")
        assert_matches(got[1], rs_block(ref_reduce(ys, I32, hvd.Sum), 2 * S - 1, R), I32,
                       (rs_rows(2 * S - 1, R),), "grouped[1]")
        got = hvd.grouped_reducescatter([ys[R], xs[R]], op=hvd.Average, prescale_factor=2.0)
        assert_matches(got[0], rs_block(ref_reduce(ys, I32, hvd.Average, 2.0), 2 * S - 1, R), I32,
                       (rs_rows(2 * S - 1, R),), "unnamed grouped[0]")


# ---------------------------------------------------------------- grouped allreduce

def fam_grouped():
    mix = [(F32, (5,)), (I32, (3, 2)), (F64, (7,)), (F16, (4,)), (I8, (1,)), (F32, (0,)), (U8, (2, 2, 2))]
    if BFLOAT16 is not None:
        mix.append((BFLOAT16, (6,)))
    for opname, op in OPS.items():
        for pre, post in [(1.0, 1.0), SCALES[opname][-1]]:
            label = f"grouped_allreduce {opname} pre={pre} post={post}"
            low, high = (-2, 3) if opname == "Product" else (-8, 8)

            @case(label)
            def _():
                xss = [all_inputs(f"{label}{i}", shape, dt, low, high) for i, (dt, shape) in enumerate(mix)]
                mine = [xs[R].copy() for xs in xss]
                got = hvd.grouped_allreduce(mine, op=op, name=label, prescale_factor=pre, postscale_factor=post)
                assert isinstance(got, list) and len(got) == len(mix)
                for i, ((dt, shape), xs) in enumerate(zip(mix, xss)):
                    assert_matches(got[i], ref_reduce(xs, dt, op, pre, post), dt, shape, f"member {i}")
                    assert_same(mine[i], xs[R], f"input {i} after grouped_allreduce")
                ret = hvd.grouped_allreduce_(mine, op=op, name=label + ".inplace", prescale_factor=pre,
                                             postscale_factor=post)
                assert all(a is b for a, b in zip(ret, mine)), "grouped_allreduce_ must return its arguments"
                for i, ((dt, shape), xs) in enumerate(zip(mix, xss)):
                    assert_matches(mine[i], ref_reduce(xs, dt, op, pre, post), dt, shape, f"in-place member {i}")

    label = "grouped_allreduce async, bool, single member, unnamed"

    @case(label)
    def _():
        xs = all_inputs(label + "x", (10,), F32)
        bs = all_inputs(label + "b", (3, 3), BOOL)
        h = hvd.grouped_allreduce_async([xs[R], bs[R]], op=hvd.Max, name=label + ".async")
        deadline = time.time() + 60
        while not hvd.poll(h):
            assert time.time() < deadline, "poll never became true"
            time.sleep(0.001)
        got = hvd.synchronize(h)
        assert_matches(got[0], ref_reduce(xs, F32, hvd.Max), F32, (10,), "async member 0")
        assert_matches(got[1], ref_reduce(bs, BOOL, hvd.Max), BOOL, (3, 3), "async bool member")
        mine = [xs[R].copy(), bs[R].copy()]
        h = hvd.grouped_allreduce_async_(mine, op=hvd.Min, name=label + ".async_")
        ret = hvd.synchronize(h)
        assert ret[0] is mine[0] and ret[1] is mine[1]
        assert_matches(mine[0], ref_reduce(xs, F32, hvd.Min), F32, (10,), "async_ member 0")
        assert_matches(mine[1], ref_reduce(bs, BOOL, hvd.Min), BOOL, (3, 3), "async_ bool member")
        got = hvd.grouped_allreduce([xs[R]], op=hvd.Sum, name=label + ".single")
        assert_matches(got[0], ref_reduce(xs, F32, hvd.Sum), F32, (10,), "single member")
        for _ in range(3):
            got = hvd.grouped_allreduce([xs[R], xs[R][:3]])  # unnamed, default Average
            assert_matches(got[0], ref_reduce(xs, F32, hvd.Average), F32, (10,), "unnamed grouped")
            assert_matches(got[1], ref_reduce([x[:3] for x in xs], F32, hvd.Average), F32, (3,), "unnamed grouped")


# ---------------------------------------------------------------- results in the caller's type

TYPECODES = {"b": np.int8, "B": np.uint8, "h": np.int16, "i": np.int32, "q": np.int64, "f": np.float32,
             "d": np.float64}


def as_values(x):
    return np.asarray(memoryview(x)) if not isinstance(x, np.ndarray) else x


def fam_types():
    for code, npt in TYPECODES.items():
        dt = np.dtype(npt)
        label = f"array.array('{code}')"

        @case(label + " allreduce/broadcast/reducescatter")
        def _():
            xs = all_inputs(label + "ar", (7,), dt, 0 if dt.kind == "u" else -8, 8)
            a = array.array(code, xs[R].tobytes())
            got = hvd.allreduce(a, op=hvd.Sum, name=label + ".ar")
            assert type(got) is array.array and got.typecode == code, f"got {type(got).__name__}"
            assert_matches(as_values(got), ref_reduce(xs, dt, hvd.Sum), dt, (7,), "allreduce")
            b = array.array(code, xs[R].tobytes())
            ret = hvd.allreduce_(b, op=hvd.Max, name=label + ".ar_")
            assert ret is b, "allreduce_ must return its argument"
            assert_matches(as_values(b), ref_reduce(xs, dt, hvd.Max), dt, (7,), "allreduce_")
            for root in range(S):
                got = hvd.broadcast(a, root, name=f"{label}.bc.{root}")
                assert type(got) is array.array and got.typecode == code
                assert_same(as_values(got), xs[root], "broadcast")
                c = array.array(code, xs[R].tobytes())
                assert hvd.broadcast_(c, root, name=f"{label}.bc_.{root}") is c
                assert_same(as_values(c), xs[root], "broadcast_")
            dim0 = 7
            got = hvd.reducescatter(a, op=hvd.Sum, name=label + ".rs")
            assert type(got) is array.array and got.typecode == code
            assert_matches(as_values(got), rs_block(ref_reduce(xs, dt, hvd.Sum), dim0, R), dt, (rs_rows(dim0, R),),
                           "reducescatter")

        @case(label + " allgather/alltoall")
        def _():
            xs = all_inputs(label + "ag", lambda r: (ag_rows(r),), dt)
            got = hvd.allgather(array.array(code, xs[R].tobytes()), name=label + ".ag")
            assert type(got) is array.array and got.typecode == code
            assert_same(as_values(got), np.concatenate(xs), "allgather")
            ys = all_inputs(label + "a2a", (2 * S,), dt)
            got = hvd.alltoall(array.array(code, ys[R].tobytes()), name=label + ".a2a")
            assert type(got) is array.array and got.typecode == code
            assert_same(as_values(got), np.concatenate([y[2 * R:2 * R + 2] for y in ys]), "alltoall")
            zs = all_inputs(label + "a2as", lambda r: (sum(a2a_splits(r)),), dt)
            out, rsplits = hvd.alltoall(array.array(code, zs[R].tobytes()), splits=a2a_splits(R),
                                        name=label + ".a2as")
            exp_out, exp_splits = a2a_expected(zs, a2a_splits)
            assert type(out) is array.array and out.typecode == code
            assert_same(as_values(out), exp_out, "alltoall with splits")

        @case(label + " alltoall received_splits holds the counts")
        def _():
            zs = all_inputs(label + "a2as2", lambda r: (sum(a2a_splits(r)),), dt)
            _, rsplits = hvd.alltoall(array.array(code, zs[R].tobytes()), splits=a2a_splits(R),
                                      name=label + ".a2as2")
            exp_splits = a2a_expected(zs, a2a_splits)[1]
            # received_splits must hold the split counts (a numpy int32 array per the API)
            assert np.asarray(rsplits).tolist() == exp_splits.tolist(), (
                f"received_splits for array.array('{code}') input is {rsplits!r}, expected {exp_splits.tolist()}")

    label = "bytearray / bytes / memoryview"

    @case(label)
    def _():
        xs = all_inputs(label, (13,), U8, 0, 8)
        ba = bytearray(xs[R].tobytes())
        got = hvd.allreduce(ba, op=hvd.Sum, name=label + ".ar")
        assert type(got) is bytearray, type(got).__name__
        assert_matches(np.frombuffer(bytes(got), U8), ref_reduce(xs, U8, hvd.Sum), U8, (13,), "bytearray allreduce")
        assert ba == bytearray(xs[R].tobytes()), "input bytearray changed"
        ret = hvd.allreduce_(ba, op=hvd.Max, name=label + ".ar_")
        assert ret is ba
        assert_matches(np.frombuffer(bytes(ba), U8), ref_reduce(xs, U8, hvd.Max), U8, (13,), "bytearray allreduce_")
        for root in range(S):
            got = hvd.broadcast(bytearray(xs[R].tobytes()), root, name=f"{label}.bc.{root}")
            assert type(got) is bytearray and got == bytearray(xs[root].tobytes())
            c = bytearray(xs[R].tobytes())
            assert hvd.broadcast_(c, root, name=f"{label}.bc_.{root}") is c
            assert c == bytearray(xs[root].tobytes())
        ys = all_inputs(label + "ag", lambda r: (ag_rows(r) * 3,), U8, 0, 200)
        got = hvd.allgather(bytearray(ys[R].tobytes()), name=label + ".ag")
        assert type(got) is bytearray and got == bytearray(np.concatenate(ys).tobytes())
        got = hvd.allgather(ys[R].tobytes(), name=label + ".ag.bytes")
        assert type(got) is bytes and got == np.concatenate(ys).tobytes()
        zs = all_inputs(label + "a2a", (3 * S,), U8, 0, 200)
        got = hvd.alltoall(bytearray(zs[R].tobytes()), name=label + ".a2a")
        assert type(got) is bytearray and got == bytearray(np.concatenate([z[3 * R:3 * R + 3] for z in zs]).tobytes())
        got = hvd.allreduce(xs[R].tobytes(), op=hvd.Sum, name=label + ".bytes")
        assert type(got) is bytes and got == ref_reduce(xs, U8, hvd.Sum).astype(U8).tobytes()
        expect_raises(hvd.InvalidArgumentError, lambda: hvd.allreduce_(xs[R].tobytes(), name=label + ".ro"),
                      ValueError)
        fs = all_inputs(label + "mv", (2, 3), F32)
        got = hvd.allreduce(memoryview(fs[R]), op=hvd.Sum, name=label + ".mv")
        assert type(got) is memoryview, type(got).__name__
        assert_matches(np.asarray(got), ref_reduce(fs, F32, hvd.Sum), F32, (2, 3), "memoryview allreduce")

    label = "bytearray alltoall with splits"

    @case(label)
    def _():
        ws = all_inputs(label, lambda r: (sum(a2a_splits(r)),), U8, 0, 200)
        out, rsplits = hvd.alltoall(bytearray(ws[R].tobytes()), splits=a2a_splits(R), name=label)
        exp_out, exp_splits = a2a_expected(ws, a2a_splits)
        assert type(out) is bytearray and out == bytearray(exp_out.tobytes())
        assert np.asarray(rsplits).tolist() == exp_splits.tolist(), (
            f"received_splits for bytearray input is {rsplits!r}, expected {exp_splits.tolist()}")

    label = "handles"

    @case(label)
    def _():
        expect_raises(hvd.InvalidArgumentError, lambda: hvd.synchronize(object()), ValueError)
        expect_raises(hvd.InvalidArgumentError, lambda: hvd.poll(None), ValueError)
        xs = all_inputs(label, (4,), F32)
        h = hvd.allreduce_async(xs[R], op=hvd.Sum, name=label)
        first = hvd.synchronize(h)
        assert hvd.poll(h), "poll after synchronize"
        assert hvd.synchronize(h) is first, "a second synchronize returns the same result"
        assert_matches(first, ref_reduce(xs, F32, hvd.Sum), F32, (4,))


# ---------------------------------------------------------------- object collectives and barrier

def fam_objects():
    label = "broadcast_object"

    @case(label)
    def _():
        for root in range(S):
            obj = {"rank": R, "payload": list(range(R * 10)), "text": "x" * (R * 1000), "arr": np.arange(R + 1)}
            got = hvd.broadcast_object(obj, root_rank=root, name=f"{label}.{root}")
            assert got["rank"] == root and got["payload"] == list(range(root * 10))
            assert got["text"] == "x" * (root * 1000)
            np.testing.assert_array_equal(got["arr"], np.arange(root + 1))
        assert hvd.broadcast_object(None if R else ("only", "root"), 0) == ("only", "root")

    label = "allgather_object"

    @case(label)
    def _():
        objs = [([] if r == 0 else {"r": r, "s": "y" * (r * 777)}) for r in range(S)]
        assert hvd.allgather_object(objs[R], name=label) == objs
        assert hvd.allgather_object(R * 2) == [2 * r for r in range(S)]
        assert hvd.allgather_object(None, name=label + ".none") == [None] * S

    label = "barrier"

    @case(label)
    def _():
        for i in range(3):
            hvd.barrier()
            hvd.barrier(name=f"{label}.{i}")


# ---------------------------------------------------------------- many async ops, fusion, response cache

STRESS_DTYPES = [F32, I32, F64, I8, F16] + ([BFLOAT16] if BFLOAT16 is not None else [])
STRESS_OPS = [("Sum", 1.0, 1.0), ("Average", 1.0, 1.0), ("Max", 1.0, 1.0), ("Sum", 2.0, 0.5), ("Min", 1.0, 1.0),
              ("Average", 0.5, 3.0)]


def stress_spec(i, it=0):
    rng = np.random.default_rng([seed("stress spec"), i, it])
    dt = STRESS_DTYPES[i % len(STRESS_DTYPES)]
    opname, pre, post = STRESS_OPS[(i // len(STRESS_DTYPES)) % len(STRESS_OPS)]
    n = int(rng.integers(1, 40))
    shape = (n,) if i % 3 else (n, 2)
    if i % 50 == 7:
        shape = (1500,)  # larger than a 4 KiB fusion buffer on its own
    if i % 41 == 5:
        shape = (0,)
    return dt, OPS[opname], pre, post, shape


def fam_stress():
    label = "200 async allreduces before any synchronize"

    @case(label)
    def _():
        specs = [stress_spec(i) for i in range(200)]
        inputs = [all_inputs(f"{label}{i}", shape, dt) for i, (dt, _, _, _, shape) in enumerate(specs)]
        handles = []
        for i, ((dt, op, pre, post, shape), xs) in enumerate(zip(specs, inputs)):
            handles.append(hvd.allreduce_async(xs[R], op=op, name=f"stress.many.{i}", prescale_factor=pre,
                                               postscale_factor=post))
        for i in reversed(range(200)):
            dt, op, pre, post, shape = specs[i]
            assert_matches(hvd.synchronize(handles[i]), ref_reduce(inputs[i], dt, op, pre, post), dt, shape,
                           f"stress.many.{i} ({dname(dt)})")

    label = "200 unnamed small allreduces, in place, async"

    @case(label)
    def _():
        xss = [all_inputs(f"{label}{i}", (1 + i % 13,), F32) for i in range(200)]
        bufs = [xs[R].copy() for xs in xss]
        handles = [hvd.allreduce_async_(b, op=hvd.Sum) for b in bufs]
        for h, b, xs in zip(handles, bufs, xss):
            assert hvd.synchronize(h) is b
            assert_matches(b, ref_reduce(xs, F32, hvd.Sum), F32, b.shape, "unnamed in-place")

    label = "async inputs kept alive without a caller reference"

    @case(label)
    def _():
        import gc

        xss = [all_inputs(f"{label}{i}", (64 + i,), F64) for i in range(50)]
        # The caller keeps no reference to the inputs (temporary copies and strided views)
        # or to the in-place targets' bases; collect and churn memory before synchronizing.
        hs = [hvd.allreduce_async(xs[R].copy()[::1 + i % 2], op=hvd.Sum, name=f"{label}.{i}")
              for i, xs in enumerate(xss)]
        gc.collect()
        churn = [np.full(64 + i, -1.0) for i in range(200)]
        for i, (h, xs) in enumerate(zip(hs, xss)):
            exp = ref_reduce([x[::1 + i % 2] for x in xs], F64, hvd.Sum)
            assert_matches(hvd.synchronize(h), exp, F64, exp.shape, f"{label}.{i}")
        del churn

    label = "every op outstanding at once"

    @case(label)
    def _():
        a = all_inputs(label + "a", (33,), F32)
        b = all_inputs(label + "b", lambda r: (ag_rows(r), 2), I32)
        c = all_inputs(label + "c", (5, 5), F64)
        d = all_inputs(label + "d", lambda r: (sum(a2a_splits(r)), 3), F16)
        e = all_inputs(label + "e", (2 * S + 1, 4), I64)
        f = [all_inputs(label + f"f{i}", (i + 1,), F32) for i in range(4)]
        g = all_inputs(label + "g", (S * 2, 2), U8, 0, 8)
        a_ip = a[R].copy()
        hs = {
            "ar": hvd.allreduce_async(a[R], op=hvd.Sum, name=label + ".ar"),
            "ar_": hvd.allreduce_async_(a_ip, op=hvd.Max, name=label + ".ar_"),
            "ag": hvd.allgather_async(b[R], name=label + ".ag"),
            "bc": hvd.broadcast_async(c[R], S - 1, name=label + ".bc"),
            "a2a": hvd.alltoall_async(d[R], splits=a2a_splits(R), name=label + ".a2a"),
            "a2a_eq": hvd.alltoall_async(g[R], name=label + ".a2a_eq"),
            "rs": hvd.reducescatter_async(e[R], op=hvd.Average, name=label + ".rs"),
            "grp": hvd.grouped_allreduce_async([x[R] for x in f], op=hvd.Sum, name=label + ".grp"),
        }
        order = ["rs", "grp", "a2a", "ar_", "bc", "ar", "ag", "a2a_eq"]
        res = {k: hvd.synchronize(hs[k]) for k in order}
        assert_matches(res["ar"], ref_reduce(a, F32, hvd.Sum), F32, (33,), "ar")
        assert res["ar_"] is a_ip
        assert_matches(a_ip, ref_reduce(a, F32, hvd.Max), F32, (33,), "ar_")
        assert_same(res["ag"], np.concatenate(b), "ag")
        assert_same(res["bc"], c[S - 1], "bc")
        exp_out, exp_splits = a2a_expected(d, a2a_splits)
        assert_same(res["a2a"][0], exp_out, "a2a")
        assert_same(res["a2a"][1], exp_splits, "a2a splits")
        # An alltoall handle resolves to (received, received_splits), splits given or not.
        assert_same(res["a2a_eq"][0], np.concatenate([x[2 * R:2 * R + 2] for x in g]), "a2a_eq")
        assert_matches(res["rs"], rs_block(ref_reduce(e, I64, hvd.Average), 2 * S + 1, R), I64,
                       (rs_rows(2 * S + 1, R), 4), "rs")
        for i in range(4):
            assert_matches(res["grp"][i], ref_reduce(f[i], F32, hvd.Sum), F32, (i + 1,), f"grp {i}")

    label = "same names reused over iterations"

    @case(label)
    def _():
        for it in range(24):
            # allreduce: data changes every iteration, shape every 6, op every 8
            shape = (5 + it // 6,)
            op = hvd.Sum if (it // 8) % 2 == 0 else hvd.Max
            xs = all_inputs(f"{label}ar{it}", shape, F32)
            assert_matches(hvd.allreduce(xs[R], op=op, name="reuse.ar"), ref_reduce(xs, F32, op), F32, shape,
                           f"reuse.ar it={it}")
            # dtype changes every 4 iterations under the same name
            dt = [F32, I32, F64][(it // 4) % 3]
            ys = all_inputs(f"{label}dt{it}", (3, 3), dt)
            assert_matches(hvd.allreduce(ys[R], op=hvd.Average, name="reuse.dtype"), ref_reduce(ys, dt, hvd.Average),
                           dt, (3, 3), f"reuse.dtype it={it}")
            # allgather: some ranks change their first dimension, others keep it
            def rows(r, it=it):
                return (r + it // 3) % 3 if r % 2 == 0 else 2
            zs = all_inputs(f"{label}ag{it}", lambda r: (rows(r), 2), I32)
            assert_same(hvd.allgather(zs[R], name="reuse.ag"), np.concatenate(zs), f"reuse.ag it={it}")
            # alltoall: only rank 0's splits change
            def splits_of(r, it=it):
                return a2a_splits(r, it // 2 if r == 0 else 0)
            ws = all_inputs(f"{label}a2a{it}", lambda r: (sum(splits_of(r)),), F64)
            out, rsplits = hvd.alltoall(ws[R], splits=splits_of(R), name="reuse.a2a")
            exp_out, exp_splits = a2a_expected(ws, splits_of)
            assert_same(out, exp_out, f"reuse.a2a it={it}")
            assert_same(rsplits, exp_splits, f"reuse.a2a splits it={it}")
            # broadcast: the root changes
            root = it % S
            vs = all_inputs(f"{label}bc{it}", (4,), I8)
            assert_same(hvd.broadcast(vs[R], root, name="reuse.bc"), vs[root], f"reuse.bc it={it}")
            # reducescatter and a group, same names
            us = all_inputs(f"{label}rs{it}", (2 * S + 1,), F32)
            assert_matches(hvd.reducescatter(us[R], op=hvd.Sum, name="reuse.rs"),
                           rs_block(ref_reduce(us, F32, hvd.Sum), 2 * S + 1, R), F32, (rs_rows(2 * S + 1, R),),
                           f"reuse.rs it={it}")
            gs = [all_inputs(f"{label}g{it}.{j}", (j + 2,), F32) for j in range(3)]
            got = hvd.grouped_allreduce([g[R] for g in gs], op=hvd.Sum, name="reuse.grp")
            for j in range(3):
                assert_matches(got[j], ref_reduce(gs[j], F32, hvd.Sum), F32, (j + 2,), f"reuse.grp[{j}] it={it}")

    label = "ranks submit in different orders and at different speeds"

    @case(label)
    def _():
        for it in range(6):
            xss = [all_inputs(f"{label}{it}.{i}", (1 + (i * 5) % 37,), [F32, I32][i % 2]) for i in range(30)]
            gss = [all_inputs(f"{label}{it}.g{j}", (j + 1, 2), F64) for j in range(3)]
            order = np.random.default_rng([seed(label), R, it]).permutation(30)  # differs per rank
            slow = R == it % S  # one rank lags behind the others
            handles, grp = {}, None
            for pos, i in enumerate(order):
                if slow and pos % 5 == 0:
                    time.sleep(0.002)
                if pos == (7 * R + it) % 30:
                    grp = hvd.grouped_allreduce_async([g[R] for g in gss], op=hvd.Sum, name="order.grp")
                handles[int(i)] = hvd.allreduce_async(xss[i][R], op=hvd.Sum, name=f"order.{i}")
            for i in range(30):
                dt = [F32, I32][i % 2]
                assert_matches(hvd.synchronize(handles[i]), ref_reduce(xss[i], dt, hvd.Sum), dt, xss[i][R].shape,
                               f"order.{i} it={it}")
            got = hvd.synchronize(grp)
            for j in range(3):
                assert_matches(got[j], ref_reduce(gss[j], F64, hvd.Sum), F64, (j + 1, 2), f"order.grp[{j}] it={it}")

    label = "batches of named async allreduces reused over iterations"

    @case(label)
    def _():
        for it in range(8):
            xss = [all_inputs(f"{label}{it}.{i}", (1 + (i * 7) % 50,), STRESS_DTYPES[i % 3]) for i in range(40)]
            order = list(range(40)) if it % 2 == 0 else list(reversed(range(40)))  # submission order changes
            handles = {}
            for i in order:
                handles[i] = hvd.allreduce_async(xss[i][R], op=hvd.Sum, name=f"reuse.batch.{i}")
            for i in range(40):
                dt = STRESS_DTYPES[i % 3]
                assert_matches(hvd.synchronize(handles[i]), ref_reduce(xss[i], dt, hvd.Sum), dt, xss[i][R].shape,
                               f"reuse.batch.{i} it={it}")


FAMILIES = {
    "allreduce": fam_allreduce,
    "shapes": fam_shapes,
    "noncontig": fam_noncontig,
    "broadcast": fam_broadcast,
    "allgather": fam_allgather,
    "alltoall": fam_alltoall,
    "reducescatter": fam_reducescatter,
    "grouped": fam_grouped,
    "types": fam_types,
    "objects": fam_objects,
    "stress": fam_stress,
}


def main():
    global R, S, chk
    families = sys.argv[1:] or list(FAMILIES)
    unknown = [f for f in families if f not in FAMILIES]
    if unknown:
        print(f"unknown families {unknown}; known: {list(FAMILIES)}", file=sys.stderr)
        sys.exit(2)
    hvd.init()
    R, S = hvd.rank(), hvd.size()
    chk = Checker(R)
    for fam in families:
        start = time.time()
        before = len(chk.failures)
        FAMILIES[fam]()
        if R == 0:
            print(f"[rank 0] family {fam}: {len(chk.failures) - before} failed, {time.time() - start:.1f} s",
                  flush=True)
    hvd.shutdown()
    chk.finish()


if __name__ == "__main__":
    main()
