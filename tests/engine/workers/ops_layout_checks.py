"""ops_worker.py's layout families: shapes (odd sizes, zero-size and 0-d tensors, scalars, large
tensors, for every op) and noncontig (strided/transposed/Fortran/negative-stride inputs, in place too)."""
import numpy as np

import collectives as hvd
from ops_util import (BFLOAT16, BOOL, F16, F32, F64, I32, I64, OPS, U8, a2a_expected, all_inputs, assert_matches,
                      assert_same, case, ctx, dname, expect_raises, ref_reduce, rs_block, rs_rows)


# ---------------------------------------------------------------- odd sizes, zero-size and 0-d tensors

def fam_shapes():
    R, S = ctx.R, ctx.S
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
    R, S = ctx.R, ctx.S
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

