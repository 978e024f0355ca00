"""ops_worker.py's type families: types (array.array / bytearray / bytes / memoryview in and out,
handles) and objects (broadcast_object, allgather_object, barrier)."""
import array

import numpy as np

import collectives as hvd
from ops_util import (F32, U8, a2a_expected, a2a_splits, ag_rows, all_inputs, assert_matches, assert_same,
                      case, ctx, expect_raises, ref_reduce, rs_block, rs_rows)


# ---------------------------------------------------------------- results in the caller's type

TYPECODES = {"b": np.int8, "B": np.uint8, "h": np.int16, "i": np.int32, "q": np.int64, "f": np.float32,
             "d": np.float64}


def as_values(x):
    return np.asarray(memoryview(x)) if not isinstance(x, np.ndarray) else x


def fam_types():
    R, S = ctx.R, ctx.S
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
    R, S = ctx.R, ctx.S
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

