"""ops_worker.py's reduction families: allreduce (every dtype x op x prescale/postscale, in place,
async, bool rejection), reducescatter and grouped allreduce."""
import time

import numpy as np

import collectives as hvd
from ops_util import (ALL_DTYPES, BFLOAT16, BOOL, F16, F32, F64, I32, I64, I8, NUMERIC_DTYPES, OPS, SCALES,
                      U8, all_inputs, assert_matches, assert_same, case, ctx, dname, expect_raises,
                      ref_reduce, rs_block, rs_rows)



def fam_allreduce():
    R, S = ctx.R, ctx.S
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



# ---------------------------------------------------------------- reducescatter

def fam_reducescatter():
    R, S = ctx.R, ctx.S
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
    R, S = ctx.R, ctx.S
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


    label = "grouped_allreduce members taking the type-tested path and the general one"

    @case(label)
    def _():
        # requests.allreduce, per member: contiguous numpy arrays of an engine dtype (with Python int or
        # float scale factors) go through its common-call type tests, strided views and
        # Fortran order through the general checks, in one group.
        xs = all_inputs(label + "x", (6, 4), F32)
        ys = all_inputs(label + "y", (5,), I64)
        zs = all_inputs(label + "z", (3, 2), F64)
        scale = 0.5
        for inplace in (False, True):
            parent = xs[R].copy()
            strided = parent[:, ::2]
            gaps = parent[:, 1::2].copy()
            mine = [xs[R].copy(), strided, ys[R].copy(), np.array(zs[R][0, 0]), np.asfortranarray(zs[R])]
            if not inplace:
                got = hvd.grouped_allreduce(mine, op=hvd.Sum, name=f"{label}.{inplace}", prescale_factor=2,
                                            postscale_factor=scale)
            else:
                got = hvd.grouped_allreduce_(mine, op=hvd.Sum, name=f"{label}.{inplace}", prescale_factor=2,
                                             postscale_factor=scale)
                assert all(a is b for a, b in zip(got, mine)), "grouped_allreduce_ must return its arguments"
                assert_same(parent[:, 1::2], gaps, "the columns between the strided member's")
            assert_matches(got[0], ref_reduce(xs, F32, hvd.Sum, 2.0, 0.5), F32, (6, 4), f"contiguous, {inplace}")
            assert_matches(got[1], ref_reduce([x[:, ::2] for x in xs], F32, hvd.Sum, 2.0, 0.5), F32, (6, 2),
                           f"strided, {inplace}")
            assert_matches(got[2], ref_reduce(ys, I64, hvd.Sum, 2.0, 0.5), I64, (5,), f"int64, {inplace}")
            assert_matches(got[3], ref_reduce([z[0, 0] for z in zs], F64, hvd.Sum, 2.0, 0.5), F64, (),
                           f"0-d, {inplace}")
            assert_matches(np.asarray(got[4]), ref_reduce(zs, F64, hvd.Sum, 2.0, 0.5), F64, (3, 2),
                           f"Fortran order, {inplace}")
            if inplace:
                assert_matches(parent[:, ::2], ref_reduce([x[:, ::2] for x in xs], F32, hvd.Sum, 2.0, 0.5), F32,
                               (6, 2), "strided member written back")
