"""collectives.tensorflow against numpy references (run under mpirun, one process per rank).

Usage: tf_ops_worker.py FAMILY [FAMILY ...]

Every rank recomputes every rank's input with ``rank_input`` (small integers, so float16 and
bfloat16 sums are exact) and checks its own results: values, dtype, shape. Each case runs
eagerly and inside a ``tf.function`` (the "mode" in its label).
Families: allreduce, grouped, broadcast, allgather, alltoall, reducescatter, gradients, misc;
their shared helpers (rank state, dtypes, inputs, references, ``check``, ``case``) in tf_ops_common.py.
"""
import os
import sys
import warnings

import numpy as np

import collectives

# Importing collectives must not import TensorFlow (checked as the "imports" case below), so this
# is looked at before anything that imports it: TensorFlow itself, and tf_ops_common.
TF_IMPORTED_BY_COLLECTIVES = "tensorflow" in sys.modules or "keras" in sys.modules

import tensorflow as tf  # noqa: E402

import collectives.tensorflow as hvd  # noqa: E402
from collectives.adapters.tensorflow import tensors as tft  # noqa: E402
from collectives.arrays import aligned_empty  # noqa: E402
from common import BFLOAT16, Checker, rank_input  # noqa: E402
from tf_ops_common import (FLOATS, MODES, NP_OF, NUMERIC, OPS, TF_DTYPES, a2a_reference,  # noqa: E402
                           a2a_splits, case, check, ctx, expect_raises, inputs, ref_reduce, rs_rows, rs_start,
                           run, seed)


# ---------------------------------------------------------------- forward families

def fam_allreduce():
    R, S = ctx.R, ctx.S
    for dt in TF_DTYPES:
        ops = ["Min", "Max"] if dt == tf.bool else list(OPS)
        for mode in MODES:
            label = f"allreduce {dt.name} {mode}"

            @case(label)
            def _():
                for opname in ops:
                    low, high = (-2, 3) if opname == "Product" else (-8, 8)
                    refs, ts = inputs(f"{label} {opname}", (3, 5), dt, low, high)
                    got = run(mode, lambda x: hvd.allreduce(x, op=OPS[opname], name=f"{label}.{opname}"), ts[R])
                    check(got, ref_reduce(refs, dt, OPS[opname]), dt, opname)
                    if dt != tf.bool:  # unnamed, and a variable as input
                        v = tf.Variable(ts[R])
                        check(run(mode, lambda: hvd.allreduce(v, op=OPS[opname])), ref_reduce(refs, dt, OPS[opname]),
                              dt, opname + " unnamed variable")
    for dt in (tf.float32, tf.float64, tf.int32, tf.bfloat16):
        for opname, pre, post in (("Sum", 0.5, 3.0), ("Average", 1.0, 2.0)):
            label = f"allreduce scaled {dt.name} {opname} {pre} {post}"

            @case(label)
            def _():
                refs, ts = inputs(label, (7,), dt)
                for mode in MODES:
                    got = run(mode, lambda x: hvd.allreduce(x, op=OPS[opname], prescale_factor=pre,
                                                            postscale_factor=post, name=f"{label}.{mode}"), ts[R])
                    check(got, ref_reduce(refs, dt, OPS[opname], pre, post), dt, mode)

    @case("allreduce average= deprecated bool, default op, compression")
    def _():
        refs, ts = inputs("avg", (4,), tf.float32)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)
            check(hvd.allreduce(ts[R], average=False), ref_reduce(refs, tf.float32, hvd.Sum), tf.float32)
            check(hvd.allreduce(ts[R], average=True), ref_reduce(refs, tf.float32, hvd.Average), tf.float32)
        check(hvd.allreduce(ts[R]), ref_reduce(refs, tf.float32, hvd.Average), tf.float32)
        expect_raises(ValueError, lambda: hvd.allreduce(ts[R], average=True, op=hvd.Sum))
        for comp in (hvd.Compression.fp16, hvd.Compression.bf16):
            check(hvd.allreduce(ts[R], op=hvd.Sum, compression=comp), ref_reduce(refs, tf.float32, hvd.Sum),
                  tf.float32, comp.__name__)

    @case("allreduce bool Sum raises TypeError")
    def _():
        e = expect_raises(TypeError, lambda: hvd.allreduce(tf.ones([2], tf.bool), op=hvd.Sum))
        assert isinstance(e, hvd.HorovodInternalError)

    @case("allreduce of tf.IndexedSlices allgathers values and indices")
    def _():
        for mode in MODES:
            for opname in ("Sum", "Average"):
                values = tf.constant(rank_input(seed("is" + mode), R, (R + 1, 3), np.float32))
                indices = tf.constant(np.arange(R + 1, dtype=np.int64) * 2)
                got = run(mode, lambda v, i: hvd.allreduce(tf.IndexedSlices(v, i, tf.constant([8, 3], tf.int64)),
                                                           op=OPS[opname]), values, indices)
                assert isinstance(got, tf.IndexedSlices), type(got)
                dense = [np.zeros((8, 3)) for _ in range(S)]
                for r in range(S):
                    np.add.at(dense[r], np.arange(r + 1) * 2, rank_input(seed("is" + mode), r, (r + 1, 3), np.float32))
                np.testing.assert_allclose(np.asarray(tf.convert_to_tensor(got)),
                                           ref_reduce(dense, tf.float32, OPS[opname]), rtol=1e-6)


def fam_grouped():
    R = ctx.R
    dts = [tf.float32, tf.int64, tf.bfloat16, tf.float16, tf.uint8]
    for mode in MODES:
        label = f"grouped_allreduce {mode}"

        @case(label)
        def _():
            data = [inputs(f"{label}{i}", (i + 1, 3), dt, 0, 8) for i, dt in enumerate(dts)]
            ts = [d[1][R] for d in data]
            for opname in ("Sum", "Average", "Max"):
                op = OPS[opname]
                outs = run(mode, lambda *xs: hvd.grouped_allreduce(list(xs), op=op, name=f"{label}.{opname}"), *ts)
                assert len(outs) == len(ts)
                for o, d, dt in zip(outs, data, dts):
                    check(o, ref_reduce(d[0], dt, op), dt, f"{opname} {dt.name}")
            outs = run(mode, lambda *xs: hvd.grouped_allreduce(list(xs), op=hvd.Sum), *ts)  # unnamed
            for o, d, dt in zip(outs, data, dts):
                check(o, ref_reduce(d[0], dt, hvd.Sum), dt)


def fam_broadcast():
    R, S = ctx.R, ctx.S
    for dt in TF_DTYPES:
        label = f"broadcast {dt.name}"

        @case(label)
        def _():
            for mode in MODES:
                for root in sorted({0, S - 1}):
                    refs, ts = inputs(f"{label} {root}", (2, 3), dt)
                    check(run(mode, lambda x: hvd.broadcast(x, root, name=f"{label}.{mode}.{root}"), ts[R]),
                          refs[root], dt, f"{mode} root={root}")

    for mode in MODES:
        @case(f"broadcast_variables {mode}")
        def _():
            shapes = [(3, 2), (4,), ()]
            dtypes = [tf.float32, tf.int64, tf.float64]
            data = [inputs(f"bv{i}{mode}", s, d) for i, (s, d) in enumerate(zip(shapes, dtypes))]
            variables = [tf.Variable(d[1][R]) for d in data]
            seed_state = tf.Variable(np.array([R + 7, 3], np.uint32))  # Keras' seed-generator dtype
            run(mode, lambda: hvd.broadcast_variables(variables + [seed_state], root_rank=S - 1))
            for v, d, dt in zip(variables, data, dtypes):
                check(tf.convert_to_tensor(v), d[0][S - 1], dt)
            np.testing.assert_array_equal(seed_state.numpy(), [S - 1 + 7, 3])

    @case("broadcast_object / allgather_object")
    def _():
        obj = {"rank": R, "payload": list(range(R + 2))}
        assert hvd.broadcast_object(obj, root_rank=S - 1) == {"rank": S - 1, "payload": list(range(S + 1))}
        assert hvd.allgather_object(obj) == [{"rank": r, "payload": list(range(r + 2))} for r in range(S)]


def fam_allgather():
    R = ctx.R
    for dt in TF_DTYPES:
        label = f"allgather {dt.name}"

        @case(label)
        def _():
            for mode in MODES:
                refs, ts = inputs(label + mode, lambda r: (r + 1, 2), dt)
                check(run(mode, lambda x: hvd.allgather(x, name=f"{label}.{mode}"), ts[R]), np.concatenate(refs), dt,
                      mode)
                refs2, ts2 = inputs(label + mode + "2", (3,), dt)
                outs = run(mode, lambda a, b: hvd.grouped_allgather([a, b]), ts[R], ts2[R])
                check(outs[0], np.concatenate(refs), dt, "grouped 0")
                check(outs[1], np.concatenate(refs2), dt, "grouped 1")
                refs0, ts0 = inputs(label + mode + "0d", (), dt)
                check(run(mode, hvd.allgather, ts0[R]), np.stack(refs0), dt, "0-d")


def fam_alltoall():
    R, S = ctx.R, ctx.S
    for dt in TF_DTYPES:
        label = f"alltoall {dt.name}"

        @case(label)
        def _():
            refs, ts = inputs(label, lambda r: (sum(a2a_splits(label, r)), 2), dt)
            expected, counts = a2a_reference(label, refs, R)
            splits = a2a_splits(label, R)
            for mode in MODES:
                out, recv = run(mode, lambda x, s: hvd.alltoall(x, splits=s, name=f"{label}.{mode}"), ts[R],
                                tf.constant(splits, tf.int32))
                check(out, expected, dt, mode)
                check(recv, counts, tf.int32, "received splits")
                refs2, ts2 = inputs(label + "eq", (2 * S, 3), dt)
                got = run(mode, hvd.alltoall, ts2[R])
                check(got, np.concatenate([refs2[q][2 * R:2 * R + 2] for q in range(S)]), dt, "equal parts")


def fam_reducescatter():
    R, S = ctx.R, ctx.S
    for dt in NUMERIC:
        label = f"reducescatter {dt.name}"

        @case(label)
        def _():
            for mode in MODES:
                for opname in ("Sum", "Average"):
                    dim0 = 2 * S + 1
                    refs, ts = inputs(f"{label} {opname}", (dim0, 3), dt)
                    full = ref_reduce(refs, dt, OPS[opname])
                    mine = full[rs_start(dim0, R):rs_start(dim0, R) + rs_rows(dim0, R)]
                    got = run(mode, lambda x: hvd.reducescatter(x, op=OPS[opname], name=f"{label}.{mode}.{opname}"),
                              ts[R])
                    check(got, mine, dt, f"{mode} {opname}")
                    refs2, ts2 = inputs(f"{label} {opname} 2", (S, 2), dt)
                    outs = run(mode, lambda a, b: hvd.grouped_reducescatter([a, b], op=OPS[opname]), ts[R], ts2[R])
                    check(outs[0], mine, dt, "grouped 0")
                    check(outs[1], ref_reduce(refs2, dt, OPS[opname])[R:R + 1], dt, "grouped 1")


# ---------------------------------------------------------------- gradients

def grad_of(mode, forward, x, w):
    """d sum(forward(x) * w) / dx, eagerly or in a tf.function."""
    def g(x, w):
        with tf.GradientTape() as tape:
            tape.watch(x)
            y = forward(x)
            loss = tf.reduce_sum(y * w)
        return tape.gradient(loss, x)
    return run(mode, g, x, w)


def fam_gradients():
    R, S = ctx.R, ctx.S
    for dt in FLOATS:
        for mode in MODES:
            tag = f"{dt.name} {mode}"

            @case(f"gradient allreduce {tag}")
            def _():
                for opname, pre, post, named in (("Sum", 1.0, 1.0, True), ("Average", 1.0, 1.0, False),
                                                 ("Sum", 0.5, 3.0, True), ("Max", 1.0, 1.0, False)):
                    label = f"gar {tag} {opname} {pre}"
                    _, xs = inputs(label, (3, 4), dt)
                    wrefs, ws = inputs(label + "w", (3, 4), dt)
                    got = grad_of(mode, lambda x: hvd.allreduce(x, op=OPS[opname], prescale_factor=pre,
                                                                postscale_factor=post,
                                                                name=label if named else None), xs[R], ws[R])
                    check(got, ref_reduce(wrefs, dt, OPS[opname], pre, post), dt, label)

            @case(f"gradient grouped_allreduce {tag}")
            def _():
                _, xa = inputs("gga" + tag, (3,), dt)
                _, xb = inputs("ggb" + tag, (2, 2), dt)
                wa_refs, wa = inputs("ggwa" + tag, (3,), dt)
                wb_refs, wb = inputs("ggwb" + tag, (2, 2), dt)

                def g(a, b, u, v):
                    with tf.GradientTape() as tape:
                        tape.watch([a, b])
                        ya, yb = hvd.grouped_allreduce([a, b], op=hvd.Sum)
                        loss = tf.reduce_sum(ya * u) + tf.reduce_sum(yb * v)
                    return tape.gradient(loss, [a, b])
                da, db = run(mode, g, xa[R], xb[R], wa[R], wb[R])
                check(da, ref_reduce(wa_refs, dt, hvd.Sum), dt, "a")
                check(db, ref_reduce(wb_refs, dt, hvd.Sum), dt, "b")

            @case(f"gradient allgather {tag}")
            def _():
                _, xs = inputs("gag" + tag, lambda r: (r + 1, 2), dt)
                total = S * (S + 1) // 2
                wrefs, ws = inputs("gagw" + tag, (total, 2), dt)
                got = grad_of(mode, lambda x: hvd.allgather(x, name="gag" + tag), xs[R], ws[R])
                start = R * (R + 1) // 2
                check(got, ref_reduce(wrefs, dt, hvd.Average)[start:start + R + 1], dt)

            @case(f"gradient grouped_allgather {tag}")
            def _():
                _, xa = inputs("gga2" + tag, lambda r: (r + 1,), dt)
                _, xb = inputs("ggb2" + tag, lambda r: (2, 2), dt)
                wa_refs, wa = inputs("ggwa2" + tag, (S * (S + 1) // 2,), dt)
                wb_refs, wb = inputs("ggwb2" + tag, (2 * S, 2), dt)

                def g(a, b, u, v):
                    with tf.GradientTape() as tape:
                        tape.watch([a, b])
                        ya, yb = hvd.grouped_allgather([a, b])
                        loss = tf.reduce_sum(ya * u) + tf.reduce_sum(yb * v)
                    return tape.gradient(loss, [a, b])
                da, db = run(mode, g, xa[R], xb[R], wa[R], wb[R])
                start = R * (R + 1) // 2
                check(da, ref_reduce(wa_refs, dt, hvd.Average)[start:start + R + 1], dt, "a")
                check(db, ref_reduce(wb_refs, dt, hvd.Average)[2 * R:2 * R + 2], dt, "b")

            @case(f"gradient broadcast {tag}")
            def _():
                root = S - 1
                _, xs = inputs("gbc" + tag, (2, 3), dt)
                wrefs, ws = inputs("gbcw" + tag, (2, 3), dt)
                got = grad_of(mode, lambda x: hvd.broadcast(x, root), xs[R], ws[R])
                expected = ref_reduce(wrefs, dt, hvd.Average) if R == root else np.zeros((2, 3))
                check(got, expected, dt)

            @case(f"gradient alltoall {tag}")
            def _():
                label = "ga2a" + tag
                # One row more than the splits send: not sent, so its gradient is zero.
                _, xs = inputs(label, lambda r: (sum(a2a_splits(label, r)) + 1, 2), dt)
                splits = a2a_splits(label, R)
                received = sum(a2a_splits(label, q)[R] for q in range(S))
                wrefs = [rank_input(seed(label + "w"), r, (sum(a2a_splits(label, q)[r] for q in range(S)), 2),
                                    NP_OF[dt]).astype(np.float64) for r in range(S)]
                w = tf.constant(wrefs[R].astype(NP_OF[dt]))
                assert w.shape[0] == received
                got = grad_of(mode, lambda x: hvd.alltoall(x, splits=splits)[0], xs[R], w)
                # The rows this rank sent to rank q come back as q's weights for them.
                expected = []
                for q in range(S):
                    offset = sum(a2a_splits(label, p)[q] for p in range(R))
                    expected.append(wrefs[q][offset:offset + splits[q]])
                check(got, np.concatenate(expected + [np.zeros((1, 2))]), dt)

            @case(f"gradient reducescatter {tag}")
            def _():
                for opname in ("Sum", "Average"):
                    dim0 = 2 * S + 1
                    _, xs = inputs(f"grs{tag}{opname}", (dim0, 2), dt)
                    wrefs = [rank_input(seed(f"grsw{tag}{opname}"), r, (rs_rows(dim0, r), 2), NP_OF[dt])
                             .astype(np.float64) for r in range(S)]
                    w = tf.constant(wrefs[R].astype(NP_OF[dt]))
                    got = grad_of(mode, lambda x: hvd.reducescatter(x, op=OPS[opname]), xs[R], w)
                    scale = S if opname == "Sum" else 1  # Horovod's reducescatter gradient
                    check(got, np.concatenate(wrefs) * scale, dt, opname)


# ---------------------------------------------------------------- misc

TF_NAMES = """init shutdown is_initialized size rank local_size local_rank cross_size cross_rank mpi_built mpi_enabled
mpi_threads_supported nccl_built gloo_built cuda_built Average Sum Min Max Product Adasum allreduce grouped_allreduce
allgather grouped_allgather broadcast broadcast_ alltoall reducescatter grouped_reducescatter join barrier
broadcast_variables broadcast_object allgather_object Compression DistributedGradientTape DistributedOptimizer
ProcessSet global_process_set add_process_set remove_process_set size_op rank_op HorovodInternalError""".split()
KERAS_NAMES = """init size rank allreduce allgather broadcast reducescatter DistributedOptimizer Compression load_model
callbacks broadcast_object allgather_object join barrier""".split()
CALLBACKS = ["BroadcastGlobalVariablesCallback", "MetricAverageCallback", "LearningRateWarmupCallback",
             "LearningRateScheduleCallback"]


def fam_misc():
    R, S = ctx.R, ctx.S
    @case("imports: collectives alone imports no framework; the faces have Horovod's names")
    def _():
        assert not TF_IMPORTED_BY_COLLECTIVES
        import collectives.keras as hk
        import collectives.keras.callbacks as cb
        assert issubclass(hvd.HorovodInternalError, RuntimeError)
        for module, names in ((hvd, TF_NAMES), (hk, KERAS_NAMES), (cb, CALLBACKS)):
            missing = [n for n in names if not hasattr(module, n)]
            assert not missing, f"{module.__name__} lacks {missing}"

    @case("zero-copy: aligned results are shared with TensorFlow, unaligned ones copied aligned")
    def _():
        a = aligned_empty((1000,), np.float32)
        a[:] = 1.0
        t = tft.to_tensor(a)
        assert np.asarray(t).ctypes.data == a.ctypes.data
        a[0] = 5.0
        assert float(t[0]) == 5.0
        unaligned = np.frombuffer(np.arange(1001, dtype=np.float32).tobytes(), dtype=np.float32, offset=4)
        assert unaligned.ctypes.data % 64 != 0
        u = tft.to_tensor(unaligned)
        assert np.asarray(u).ctypes.data % 64 == 0 and float(tf.reduce_sum(u)) == float(unaligned.sum())
        b = tf.constant(np.arange(6, dtype=np.float32))
        assert tft.to_numpy(b).ctypes.data == np.asarray(b).ctypes.data  # a view, not a copy
        bf = tft.to_tensor(np.ones(3, BFLOAT16))
        assert bf.dtype == tf.bfloat16

    @case("repeated unnamed calls inside one tf.function agree across ranks")
    def _():
        @tf.function
        def steps(x):
            total = tf.zeros_like(x)
            for _ in range(3):
                total += hvd.allreduce(x, op=hvd.Sum)
            return total + hvd.allgather(x)[:1]
        for _ in range(3):
            got = steps(tf.constant([float(R)]))
            np.testing.assert_allclose(got.numpy(), [3 * S * (S - 1) / 2 + 0.0])

    @case("XLA: a clear error instead of a kernel failure")
    def _():
        f = tf.function(lambda x: hvd.allreduce(x), jit_compile=True)
        expect_raises(hvd.XlaNotSupportedError, lambda: f(tf.ones([2])), match="jit_compile")

    @case("mismatched shapes raise on every rank, eagerly and in tf.function")
    def _():
        x = tf.ones([R + 2])
        expect_raises(collectives.TensorMismatchError, lambda: hvd.allreduce(x, name="mismatch.eager"))
        e = expect_raises(tf.errors.OpError, lambda: tf.function(lambda t: hvd.allreduce(t, name="mismatch.fn"))(x))
        assert "mismatch.fn" in str(e), str(e)

    @case("join")
    def _():
        last = hvd.join()
        assert last.dtype == tf.int32 and 0 <= int(last) < S
        assert 0 <= int(tf.function(hvd.join)()) < S

    @case("join: ranks out of data contribute zeros to the others' allreduces")
    def _():
        steps = 2 if R == 0 else 1  # rank 0 has one batch more than the others
        w = tf.Variable([1.0, 2.0])
        for i in range(steps):
            got = hvd.allreduce(tf.constant([1.0]), op=hvd.Sum, name=f"join.uneven.{i}")
            np.testing.assert_allclose(got.numpy(), [S if i == 0 else 1.0])
            with tf.GradientTape() as tape:
                loss = tf.reduce_sum(w * float(R + 1))
            grad = hvd.DistributedGradientTape(tape).gradient(loss, [w])[0]
            # Average over all ranks; joined ranks count as zeros.
            expected = np.mean([r + 1.0 for r in range(S)]) if i == 0 else 1.0 / S
            np.testing.assert_allclose(grad.numpy(), [expected] * 2, rtol=1e-6)
        assert int(hvd.join()) == 0  # rank 0 joined last

    @case("barrier, size ops")
    def _():
        hvd.barrier()
        run("function", lambda: hvd.barrier())
        assert hvd.global_process_set.size() == S and hvd.global_process_set.rank() == R
        assert int(hvd.size_op()) == S and int(hvd.rank_op()) == R

    @case("process sets: ops and DistributedGradientTape within a subset of the ranks")
    def _():
        ranks = [0, S - 1] if S > 2 else [S - 1]
        ps = hvd.add_process_set(ranks)
        try:
            x = tf.constant([R + 1.0, 2.0 * R])
            for mode in MODES:
                if R in ranks:
                    got = run(mode, lambda t: hvd.allreduce(t, op=hvd.Sum, process_set=ps), x)
                    np.testing.assert_allclose(got.numpy(), [sum(r + 1.0 for r in ranks), sum(2.0 * r for r in ranks)])
                    got = run(mode, lambda t: hvd.allgather(t, process_set=ps), x)
                    np.testing.assert_allclose(got.numpy(), np.concatenate([[r + 1.0, 2.0 * r] for r in ranks]))
            w = tf.Variable([1.0, 1.0])
            with tf.GradientTape() as tape:
                loss = tf.reduce_sum(w * x)
            grad = hvd.DistributedGradientTape(tape, process_set=ps).gradient(loss, [w])[0]
            expected = np.mean([[r + 1.0, 2.0 * r] for r in ranks], axis=0) if R in ranks else x.numpy()
            np.testing.assert_allclose(grad.numpy(), expected)
            expect_raises(ValueError, lambda: hvd.allreduce(x, process_set=hvd.ProcessSet([0])))  # unregistered
        finally:
            hvd.remove_process_set(ps)
        hvd.allreduce(tf.ones([1]), process_set=hvd.global_process_set)

    @case("unsupported dtype names the supported ones")
    def _():
        expect_raises(TypeError, lambda: hvd.allreduce(tf.ones([2], tf.complex64)), match="supported")


FAMILIES = {"allreduce": fam_allreduce, "grouped": fam_grouped, "broadcast": fam_broadcast,
            "allgather": fam_allgather, "alltoall": fam_alltoall, "reducescatter": fam_reducescatter,
            "gradients": fam_gradients, "misc": fam_misc}


def main():
    hvd.init()
    ctx.R, ctx.S = hvd.rank(), hvd.size()
    ctx.chk = Checker(ctx.R)
    for fam in sys.argv[1:]:
        FAMILIES[fam]()
    hvd.shutdown()
    ctx.chk.finish()


if __name__ == "__main__":
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    main()
