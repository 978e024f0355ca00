"""ops_worker.py's stress family: hundreds of async ops before any synchronize, every op outstanding
at once, names reused over iterations, ranks submitting in different orders and at different speeds."""
import time

import numpy as np

import collectives as hvd
from ops_util import (BFLOAT16, F16, F32, F64, I32, I64, I8, OPS, U8, a2a_expected, a2a_splits, ag_rows,
                      all_inputs, assert_matches, assert_same, case, ctx, dname, ref_reduce, rs_block,
                      rs_rows, seed)


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
    R, S = ctx.R, ctx.S
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

