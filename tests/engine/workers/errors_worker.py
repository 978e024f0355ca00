"""Error paths under mpirun.

  errors_worker.py mismatch   cross-rank disagreements (fresh and cached names) raise
                              TensorMismatchError on every rank, quickly, with a message naming
                              the tensor and what differs; the engine keeps working afterwards
  errors_worker.py resync     synchronize() of a handle that failed, a second time
  errors_worker.py local      errors detected on the calling rank at submission: duplicate
                              names in flight, unsupported dtypes, bad root ranks

The rank that disagrees is the last one (size - 1), except where a case says otherwise.
"""
import re
import sys
import time

import numpy as np

import collectives as hvd
from common import Checker
from robust_util import expect_error, shape_in, wait

# A mismatch must be reported within seconds; this is the generous bound on a loaded machine.
MISMATCH_DEADLINE_S = 15.0


def main():
    mode = sys.argv[1]
    hvd.init()
    r, n = hvd.rank(), hvd.size()
    chk = Checker(r)
    {"mismatch": mismatch_cases, "local": local_cases, "resync": resync_cases}[mode](r, n, chk)
    hvd.shutdown()
    chk.finish()


def healthy(r, n, tag):
    """A normal allreduce after an error: the engine must still work."""
    x = np.full((3,), r + 1, dtype=np.float32)
    out = wait(hvd.allreduce_async(x, op=hvd.Sum, name=f"healthy.{tag}"), 30, f"healthy allreduce after {tag}")
    np.testing.assert_array_equal(out, np.full((3,), n * (n + 1) / 2, dtype=np.float32))


def mismatch_cases(r, n, chk):
    odd = n - 1          # the rank that disagrees
    me_odd = r == odd

    def expect_mismatch(label, submit, checks):
        def run():
            handle = submit()
            err, seconds = expect_error(handle, hvd.TensorMismatchError, MISMATCH_DEADLINE_S, label)
            msg = str(err)
            assert seconds < MISMATCH_DEADLINE_S, f"{label}: took {seconds:.1f} s"
            if r == 0:
                print(f"[rank 0] {label}: raised after {seconds:.2f} s: {msg}", flush=True)
            assert isinstance(err, hvd.CollectivesError) and isinstance(err, RuntimeError)
            for what, ok in checks(msg):
                assert ok, f"{label}: message does not name {what}: {msg!r}"
            healthy(r, n, label)
        chk.check(label, run)

    def checks_with(name, extra, rank=odd):
        """The message names the tensor, the disagreeing rank, and (extra) what differs."""
        def fn(msg):
            return [("the tensor", name in msg), (f"rank {rank}", f"rank {rank}" in msg)] + extra(msg)
        return fn

    f32 = np.float32

    # --- shapes
    expect_mismatch(
        "allreduce shape",
        lambda: hvd.allreduce_async(np.ones((3, 2) if me_odd else (2, 3), f32), op=hvd.Sum, name="mm.allreduce.shape"),
        checks_with("mm.allreduce.shape", lambda m: [("shape [2, 3]", shape_in(m, (2, 3))),
                                                     ("shape [3, 2]", shape_in(m, (3, 2))),
                                                     ("'shape'", "shape" in m.lower())]))

    def reuse_after_mismatch():
        # The failed name is free again and negotiates afresh.
        out = wait(hvd.allreduce_async(np.full((2, 3), r, f32), op=hvd.Sum, name="mm.allreduce.shape"), 30,
                   "reuse of a name that mismatched")
        np.testing.assert_array_equal(out, np.full((2, 3), n * (n - 1) / 2, f32))
    chk.check("name reusable after a mismatch", reuse_after_mismatch)

    expect_mismatch(
        "broadcast shape",
        lambda: hvd.broadcast_async(np.ones((6,) if me_odd else (4,), f32), 0, name="mm.broadcast.shape"),
        checks_with("mm.broadcast.shape", lambda m: [("shape [4]", shape_in(m, (4,))), ("shape [6]", shape_in(m, (6,)))]))

    expect_mismatch(
        "reducescatter shape",
        lambda: hvd.reducescatter_async(np.ones((6, 2) if me_odd else (4, 2), f32), op=hvd.Sum,
                                        name="mm.reducescatter.shape"),
        checks_with("mm.reducescatter.shape",
                    lambda m: [("shape [4, 2]", shape_in(m, (4, 2))), ("shape [6, 2]", shape_in(m, (6, 2)))]))

    # --- data type
    expect_mismatch(
        "allreduce dtype",
        lambda: hvd.allreduce_async(np.ones(5, np.int32 if me_odd else f32), op=hvd.Sum, name="mm.dtype"),
        checks_with("mm.dtype", lambda m: [("float32", "float32" in m), ("int32", "int32" in m)]))

    # --- operation type: allreduce on most ranks, broadcast on the odd one, same name
    expect_mismatch(
        "op type allreduce vs broadcast",
        lambda: (hvd.broadcast_async(np.ones(4, f32), 0, name="mm.optype") if me_odd
                 else hvd.allreduce_async(np.ones(4, f32), op=hvd.Sum, name="mm.optype")),
        checks_with("mm.optype", lambda m: [("allreduce", "allreduce" in m.lower()),
                                            ("broadcast", "broadcast" in m.lower())]))

    # --- reduce op
    expect_mismatch(
        "reduce op Sum vs Max",
        lambda: hvd.allreduce_async(np.ones(4, f32), op=hvd.Max if me_odd else hvd.Sum, name="mm.reduceop"),
        checks_with("mm.reduceop", lambda m: [("Sum", "sum" in m.lower()), ("Max", "max" in m.lower())]))

    # --- root rank
    expect_mismatch(
        "broadcast root",
        lambda: hvd.broadcast_async(np.ones(4, f32), 1 if me_odd else 0, name="mm.root"),
        checks_with("mm.root", lambda m: [("root 0", re.search(r"root\D{0,12}0\b", m) is not None),
                                             ("root 1", re.search(r"root\D{0,12}1\b", m) is not None)]))

    # --- allgather trailing dimensions (the first may differ, the others may not)
    def gather_trailing_checks(m):
        return [("trailing shape [3] / [2, 3]", shape_in(m, (3,)) or shape_in(m, (2, 3))),
                ("trailing shape [4] / [2, 4]", shape_in(m, (4,)) or shape_in(m, (2, 4)))]
    expect_mismatch(
        "allgather trailing dims",
        lambda: hvd.allgather_async(np.ones((2, 4) if me_odd else (2, 3), f32), name="mm.allgather.tail"),
        checks_with("mm.allgather.tail", gather_trailing_checks))

    def allgather_first_dim_may_differ():
        x = np.full((r + 1, 3), r, f32)
        out = wait(hvd.allgather_async(x, name="mm.allgather.ok"), 30, "allgather with differing first dims")
        expected = np.concatenate([np.full((p + 1, 3), p, f32) for p in range(n)])
        np.testing.assert_array_equal(out, expected)
    chk.check("allgather with differing first dims is not a mismatch", allgather_first_dim_may_differ)

    # --- prescale factor
    expect_mismatch(
        "prescale factor",
        lambda: hvd.allreduce_async(np.ones(4, f32), op=hvd.Sum, name="mm.prescale",
                                    prescale_factor=2.0 if me_odd else 1.0),
        checks_with("mm.prescale", lambda m: [("prescale", "prescale" in m.lower() or "scale" in m.lower())]))

    # --- a grouped allreduce in which one member mismatches: the whole group fails everywhere
    def grouped_mismatch():
        tensors = [np.ones(3, f32), np.ones((5,) if me_odd else (4,), f32)]
        handle = hvd.grouped_allreduce_async(tensors, op=hvd.Sum, name="mm.group")
        err, _ = expect_error(handle, hvd.TensorMismatchError, MISMATCH_DEADLINE_S, "mm.group")
        assert "mm.group" in str(err), str(err)
        healthy(r, n, "grouped")
    chk.check("grouped allreduce with one mismatched member", grouped_mismatch)

    # --- a name that was cached (completed several times), then one rank changes its shape
    def cached_iterations(name, shape, dtype, count=4):
        for i in range(count):
            x = np.full(shape, r + i, dtype)
            out = wait(hvd.allreduce_async(x, op=hvd.Sum, name=name), 30, f"{name} iteration {i}")
            np.testing.assert_array_equal(out, np.full(shape, n * i + n * (n - 1) // 2, dtype))

    chk.check("cached shape: warm-up", lambda: cached_iterations("mm.cached.shape", (3,), f32))
    expect_mismatch(
        "cached name, odd rank changes shape",
        lambda: hvd.allreduce_async(np.ones((4,) if me_odd else (3,), f32), op=hvd.Sum, name="mm.cached.shape"),
        checks_with("mm.cached.shape", lambda m: [("shape [3]", shape_in(m, (3,))), ("shape [4]", shape_in(m, (4,)))]))
    chk.check("cached shape: name usable again", lambda: cached_iterations("mm.cached.shape", (3,), f32, 2))

    # Rank 0 is the one that changes, and the change is the dtype.
    chk.check("cached dtype: warm-up", lambda: cached_iterations("mm.cached.dtype", (5,), np.float64))
    expect_mismatch(
        "cached name, rank 0 changes dtype",
        lambda: hvd.allreduce_async(np.ones(5, np.float32 if r == 0 else np.float64), op=hvd.Sum,
                                    name="mm.cached.dtype"),
        checks_with("mm.cached.dtype", lambda m: [("float32", "float32" in m), ("float64", "float64" in m)],
                    rank=1))

    # A cached broadcast whose root changes on the odd rank.
    def cached_broadcast_warmup():
        for i in range(4):
            out = wait(hvd.broadcast_async(np.full(4, r + i, f32), 0, name="mm.cached.root"), 30, "cached bcast")
            np.testing.assert_array_equal(out, np.full(4, i, f32))
    chk.check("cached root: warm-up", cached_broadcast_warmup)
    expect_mismatch(
        "cached name, odd rank changes root",
        lambda: hvd.broadcast_async(np.ones(4, f32), 1 if me_odd else 0, name="mm.cached.root"),
        checks_with("mm.cached.root", lambda m: [("root", "root" in m.lower())]))

    # A mismatch in which the odd rank is late (the others wait on it first).
    def late_submitter():
        return hvd.allreduce_async(np.ones((7,) if me_odd else (8,), f32), op=hvd.Sum, name="mm.late")
    def late():
        if me_odd:
            time.sleep(0.5)
        return late_submitter()
    expect_mismatch("late odd rank, shape", late,
                    checks_with("mm.late", lambda m: [("shape [8]", shape_in(m, (8,))), ("shape [7]", shape_in(m, (7,)))]))


def resync_cases(r, n, chk):
    f32 = np.float32
    me_odd = r == n - 1

    def mismatch_handle_twice():
        # A failed handle keeps failing: synchronizing it again must not report success.
        h = hvd.allreduce_async(np.ones((3,) if me_odd else (2,), f32), op=hvd.Sum, name="mm.resync")
        expect_error(h, hvd.TensorMismatchError, MISMATCH_DEADLINE_S, "mm.resync")
        assert hvd.poll(h)
        try:
            result = hvd.synchronize(h)
        except hvd.TensorMismatchError:
            pass
        else:
            raise AssertionError(f"second synchronize() of a failed handle returned {result!r} instead of raising")
    chk.check("synchronize a mismatched handle twice", mismatch_handle_twice)

    def success_handle_twice():
        h = hvd.allreduce_async(np.ones(2, f32), op=hvd.Sum, name="ok.resync")
        first = wait(h, 30, "ok.resync")
        second = hvd.synchronize(h)
        np.testing.assert_array_equal(first, np.full(2, n, f32))
        np.testing.assert_array_equal(second, first)
    chk.check("synchronize a successful handle twice returns the result again", success_handle_twice)


def local_cases(r, n, chk):
    f32 = np.float32

    # --- duplicate names in flight
    def in_turn(base, first, duplicate, what, check_error=lambda error, name: None):
        """Each rank in turn submits ``first(name)`` under ``base.<turn>`` and then
        ``duplicate(name)``, which must raise DuplicateNameError (``check_error`` looks at it),
        before the other ranks submit theirs: they wait at a gate that rank opens afterwards (a
        rank whose peers had all submitted could see its first request complete in between).
        Yields (name, the first request's handle) per turn, on every rank."""
        for turn in range(n):
            name = f"{base}.{turn}"
            if r == turn:
                handle = first(name)
                try:
                    try:
                        duplicate(name)
                    except hvd.DuplicateNameError as e:
                        check_error(e, name)
                    else:
                        raise AssertionError(f"{what} (rank {r})")
                finally:  # the others must not wait at the gate for a rank whose check failed
                    hvd.broadcast_object("open", root_rank=turn, name=f"{name}.gate")
            else:
                assert hvd.broadcast_object(None, root_rank=turn, name=f"{name}.gate") == "open"
                handle = first(name)
            yield name, handle

    def duplicate_allreduce():
        x = np.full(4, r + 1, f32)

        def typed(e, name):
            assert isinstance(e, ValueError), type(e).__mro__
            assert isinstance(e, hvd.InvalidArgumentError)
            assert name in str(e), str(e)
        for name, first in in_turn("dup.x", lambda name: hvd.allreduce_async(x, op=hvd.Sum, name=name),
                                   lambda name: hvd.allreduce_async(x, op=hvd.Sum, name=name),
                                   "second allreduce_async with a name in flight did not raise DuplicateNameError",
                                   typed):
            out = wait(first, 30, f"first {name}")
            np.testing.assert_array_equal(out, np.full(4, n * (n + 1) / 2, f32))
            # Once synchronized, the name can be used again (several times).
            for i in range(3):
                out = wait(hvd.allreduce_async(np.full(4, i, f32), op=hvd.Sum, name=name), 30, f"{name} reuse")
                np.testing.assert_array_equal(out, np.full(4, n * i, f32))
    chk.check("duplicate allreduce_async name", duplicate_allreduce)

    def duplicate_across_ops():
        for name, first in in_turn("dup.mixed", lambda name: hvd.allreduce_async(np.ones(2, f32), op=hvd.Sum, name=name),
                                   lambda name: hvd.broadcast_async(np.ones(2, f32), 0, name=name),
                                   "broadcast_async reusing an in-flight allreduce name did not raise"):
            out = wait(first, 30, name)
            np.testing.assert_array_equal(out, np.full(2, n, f32))
            out = wait(hvd.broadcast_async(np.full(2, r, f32), 0, name=name), 30, f"{name} as broadcast")
            np.testing.assert_array_equal(out, np.zeros(2, f32))
    chk.check("duplicate name across op types", duplicate_across_ops)

    def duplicate_grouped():
        def group(name):
            return hvd.grouped_allreduce_async([np.ones(2, f32), np.ones(3, f32)], op=hvd.Sum, name=name)
        for name, first in in_turn("dup.group", group, group,
                                   "a second grouped allreduce with the same name in flight did not raise"):
            outs = wait(first, 30, name)
            np.testing.assert_array_equal(outs[0], np.full(2, n, f32))
            np.testing.assert_array_equal(outs[1], np.full(3, n, f32))
            outs = wait(group(name), 30, f"{name} reuse")
            np.testing.assert_array_equal(outs[1], np.full(3, n, f32))
    chk.check("duplicate grouped allreduce name", duplicate_grouped)

    def duplicate_rejected_atomically():
        # A group with one name in flight is rejected as a whole: none of it is queued.
        for name, first in in_turn(
                "dup.atomic", lambda name: hvd.allreduce_async(np.ones(2, f32), op=hvd.Sum, name=f"{name}_2of2"),
                lambda name: hvd.grouped_allreduce_async([np.ones(2, f32), np.ones(2, f32)], op=hvd.Sum, name=name),
                "group containing an in-flight name did not raise"):
            wait(first, 30, f"{name}_2of2")
            # <name>_1of2 (the group's first member, Horovod's name) was not left in flight by the rejected group.
            out = wait(hvd.allreduce_async(np.ones(2, f32), op=hvd.Sum, name=f"{name}_1of2"), 30, f"{name}_1of2")
            np.testing.assert_array_equal(out, np.full(2, n, f32))
    chk.check("a group with an in-flight member name is rejected whole", duplicate_rejected_atomically)

    # --- unsupported dtypes: UnsupportedTypeError (a TypeError) for every verb
    bad = [np.zeros(4, np.complex64), np.zeros(4, np.complex128), np.array([object(), 1, "a", None], dtype=object),
           np.array(["ab", "cd", "ef", "gh"])]
    if hasattr(np, "float128"):
        bad.append(np.zeros(4, np.float128))
    verbs = {
        "allreduce": lambda x, name: hvd.allreduce(x, name=name),
        "allreduce_async": lambda x, name: hvd.allreduce_async(x, name=name),
        "allreduce_": lambda x, name: hvd.allreduce_(x, name=name),
        "grouped_allreduce": lambda x, name: hvd.grouped_allreduce([x, x], name=name),
        "broadcast": lambda x, name: hvd.broadcast(x, 0, name=name),
        "broadcast_": lambda x, name: hvd.broadcast_(x, 0, name=name),
        "allgather": lambda x, name: hvd.allgather(x, name=name),
        "alltoall": lambda x, name: hvd.alltoall(np.concatenate([x] * n), name=name),
        "reducescatter": lambda x, name: hvd.reducescatter(np.concatenate([x] * n), name=name),
    }
    for verb, call in verbs.items():
        for x in bad:
            def unsupported(call=call, x=x, verb=verb):
                try:
                    call(x, f"bad.dtype.{verb}")
                except hvd.UnsupportedTypeError as e:
                    assert isinstance(e, TypeError), type(e).__mro__
                else:
                    raise AssertionError(f"{verb} accepted dtype {x.dtype}")
            chk.check(f"{verb} with dtype {x.dtype}", unsupported)
    chk.check("engine healthy after unsupported dtypes", lambda: healthy(r, n, "dtypes"))

    def name_free_after_rejection():
        # The rejected calls above must not have left their names in flight.
        out = wait(hvd.allreduce_async(np.full(3, r, f32), op=hvd.Sum, name="bad.dtype.allreduce"), 30,
                   "reuse of a rejected name")
        np.testing.assert_array_equal(out, np.full(3, n * (n - 1) / 2, f32))
    chk.check("name of a rejected call is free", name_free_after_rejection)

    def bool_sum():
        try:
            hvd.allreduce(np.ones(4, np.bool_), op=hvd.Sum, name="bad.bool.sum")
        except hvd.UnsupportedTypeError as e:
            assert isinstance(e, TypeError)
        else:
            raise AssertionError("bool Sum allreduce accepted")
    chk.check("bool Sum allreduce", bool_sum)

    # --- root rank out of range
    for root in (n, n + 5, -1):
        for verb, call in (("broadcast", lambda x, root: hvd.broadcast(x, root, name="bad.root")),
                           ("broadcast_async", lambda x, root: hvd.broadcast_async(x, root, name="bad.root")),
                           ("broadcast_", lambda x, root: hvd.broadcast_(x, root, name="bad.root"))):
            def bad_root(call=call, root=root, verb=verb):
                try:
                    call(np.ones(4, f32), root)
                except hvd.InvalidArgumentError as e:
                    assert isinstance(e, ValueError)
                    assert str(root) in str(e), str(e)
                else:
                    raise AssertionError(f"{verb} with root {root} of {n} ranks accepted")
            chk.check(f"{verb} root {root}", bad_root)

    def root_name_free():
        out = wait(hvd.broadcast_async(np.full(4, r, f32), n - 1, name="bad.root"), 30, "valid bcast after bad root")
        np.testing.assert_array_equal(out, np.full(4, n - 1, f32))
    chk.check("broadcast with a valid root after bad ones", root_name_free)
    chk.check("engine healthy after local errors", lambda: healthy(r, n, "local"))


if __name__ == "__main__":
    sys.exit(main())
