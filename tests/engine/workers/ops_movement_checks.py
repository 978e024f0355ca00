"""ops_worker.py's data-movement families: broadcast, allgather and alltoall."""
import numpy as np

import collectives as hvd
from ops_util import (ALL_DTYPES, BOOL, F32, F64, I32, I64, I8, a2a_expected, a2a_splits, ag_rows,
                      all_inputs, assert_same, case, ctx, dname, expect_raises)


# ---------------------------------------------------------------- broadcast

def fam_broadcast():
    R, S = ctx.R, ctx.S
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
def fam_allgather():
    R, S = ctx.R, ctx.S
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
def fam_alltoall():
    R, S = ctx.R, ctx.S
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

    label = "alltoall splits summing to fewer rows than the tensor has send only those rows"

    @case(label)
    def _():
        # As in Horovod: only a sum above the first dimension is an error; the rows after the
        # splits' sum stay behind. Each rank keeps 1 + rank extra rows.
        xs = all_inputs(label, lambda r: (sum(a2a_splits(r)) + 1 + r, 3), F32)
        out, rsplits = hvd.alltoall(xs[R], splits=a2a_splits(R), name=label)
        exp_out, exp_splits = a2a_expected(xs, a2a_splits)
        assert_same(out, exp_out, "alltoall of a prefix of the rows")
        assert_same(rsplits, exp_splits, "received_splits")
        out, _ = hvd.alltoall(xs[R], splits=[0] * S, name=label + ".none")
        assert_same(out, np.zeros((0, 3), np.float32), "alltoall with all splits 0")

    label = "alltoall invalid splits raise InvalidArgumentError"

    @case(label)
    def _():
        x = np.arange(2 * S, dtype=np.float32).reshape(2 * S, 1)
        bad = {
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

