"""The synchronous allreduce's one-call path (engine.allreduce_now, csrc/python/allreduce_now.cc;
collectives/handles.py). Results against numpy references from every rank's inputs; the calls it
must leave to the general path (it returns None and submits nothing, so the same name then works
there); outputs as the general path makes them; the top-level verbs' argument forms (positional,
keyword, defaults, malformed calls, torch tensors through the same verbs); and errors through it on
every rank.
"""
import numpy as np

import collectives as hvd
from collectives import basics
from common import Checker, rank_input


class Sub(np.ndarray):
    pass


def main():
    hvd.init()
    me, n = hvd.rank(), hvd.size()
    check = Checker(me)
    engine = basics.engine()

    def all_inputs(seed, shape, dtype, low=-8, high=8):
        return [rank_input(seed, r, shape, dtype, low, high) for r in range(n)]

    # 1. Calls it leaves to the general path: None, nothing submitted (the name is reused below).
    def declined():
        x = rank_input(1, me, (4, 6), np.float32)
        frozen = x.copy()
        frozen.setflags(write=False)
        cases = {
            "non-contiguous": (x[:, ::2], hvd.Sum, 1.0, 1.0, False),
            "read-only in place": (frozen, hvd.Sum, 1.0, 1.0, True),
            "uint16": (x.astype(np.uint16), hvd.Sum, 1.0, 1.0, False),
            "big-endian": (x.astype(">f4"), hvd.Sum, 1.0, 1.0, False),
            "subclass": (x.view(Sub), hvd.Sum, 1.0, 1.0, False),
            "list": ([1.0, 2.0], hvd.Sum, 1.0, 1.0, False),
            "op True": (x, True, 1.0, 1.0, False),
            "op 6": (x, 6, 1.0, 1.0, False),
            "op float": (x, 1.0, 1.0, 1.0, False),
            "numpy scale": (x, hvd.Sum, np.float32(2.0), 1.0, False),
            "bool scale": (x, hvd.Sum, 1.0, True, False),
            "nan scale": (x, hvd.Sum, float("nan"), 1.0, False),
            "inf scale": (x, hvd.Sum, 1.0, float("inf"), False),
        }
        for label, (tensor, op, pre, post, inplace) in cases.items():
            got = engine.allreduce_now(tensor, f"now.declined.{label}", op, pre, post, inplace)
            assert got is None, f"{label}: {got!r}"
        # Nothing was submitted: the general path takes the same names.
        xs = all_inputs(1, (4, 6), np.float32)
        np.testing.assert_array_equal(hvd.allreduce(xs[me][:, ::2], op=hvd.Sum, name="now.declined.non-contiguous"),
                                      np.stack(xs).sum(axis=0)[:, ::2])
        try:  # a dtype the engine has no name for: refused on the general path
            hvd.allreduce(xs[me].astype(">f4"), op=hvd.Sum, name="now.declined.big-endian")
        except hvd.UnsupportedTypeError as e:
            assert ">f4" in str(e), str(e)
        else:
            raise AssertionError("a big-endian array was reduced")
        np.testing.assert_array_equal(hvd.allreduce(xs[me], op=hvd.Sum, prescale_factor=np.float32(2.0),
                                                    name="now.declined.numpy scale"), 2 * np.stack(xs).sum(axis=0))
    check.check("declined calls submit nothing", declined)

    # 2. Results, against references, for dtypes and ops, shapes and sizes.
    def results():
        cases = [(np.float16, hvd.Sum, (7,)), (np.float64, hvd.Average, (3, 4)), (np.int64, hvd.Min, (5,)),
                 (np.int32, hvd.Max, ()), (np.bool_, hvd.Max, (9,)), (np.int8, hvd.Product, (6,)),
                 (np.float32, hvd.Sum, (0,)), (np.uint8, hvd.Sum, (300,))]
        for k, (dtype, op, shape) in enumerate(cases):
            low, high = (-2, 3) if op == hvd.Product else (0, 8) if dtype == np.uint8 else (-8, 8)
            xs = all_inputs(10 + k, shape, dtype, low, high)
            stack = np.stack(xs)
            want = {hvd.Sum: lambda: stack.sum(axis=0, dtype=dtype), hvd.Max: lambda: stack.max(axis=0),
                    hvd.Min: lambda: stack.min(axis=0), hvd.Product: lambda: stack.prod(axis=0, dtype=dtype),
                    hvd.Average: lambda: stack.sum(axis=0) / n}[op]()
            before = xs[me].copy()
            got = hvd.allreduce(xs[me], op=op, name=f"now.result.{k}")
            assert type(got) is np.ndarray and got.dtype == np.dtype(dtype) and got.shape == shape, (k, got)
            np.testing.assert_array_equal(xs[me], before)  # the input is left alone
            np.testing.assert_allclose(got.astype(np.float64), np.asarray(want, np.float64), rtol=1e-3 if dtype == np.float16 else 1e-12)
            buf = xs[me].copy()
            assert hvd.allreduce_(buf, op=op, name=f"now.result.inplace.{k}") is buf
            np.testing.assert_array_equal(buf, got)
    check.check("results by dtype, op and shape", results)

    def direct():  # the verbs above went through it: here it is called by itself
        xs = all_inputs(20, (5,), np.float64)
        got = engine.allreduce_now(xs[me], "now.direct", hvd.Sum, 1.0, 2.0, False)
        assert type(got) is np.ndarray, repr(got)
        np.testing.assert_array_equal(got, 2 * np.stack(xs).sum(axis=0))
        buf = xs[me].copy()
        assert engine.allreduce_now(buf, "now.direct.inplace", None, 1.0, 1.0, True) is buf  # None: Average
        np.testing.assert_allclose(buf, np.stack(xs).mean(axis=0), rtol=1e-12)
    check.check("engine.allreduce_now returns the output", direct)

    def large_output():
        xs = all_inputs(30, (1 << 18,), np.float32)  # 1 MiB: the output comes from the engine's pool
        got = hvd.allreduce(xs[me], op=hvd.Sum, name="now.large", prescale_factor=0.5, postscale_factor=4.0)
        assert got.ctypes.data % 64 == 0 and got.flags.writeable and got.flags.c_contiguous
        np.testing.assert_allclose(got, np.stack(xs).sum(axis=0) * 2.0, rtol=1e-6)
        got[:] = 0  # ours to write
    check.check("a large output is aligned and writable", large_output)

    # 2b. The top-level verbs' dispatch spells out its parameters (collectives/dispatch.py): every
    #     form of call reaches the verb with the same meaning, and framework tensors still go to
    #     their adapter with the arguments given.
    def argument_forms():
        xs = all_inputs(40, (6,), np.float64)
        total = np.stack(xs).sum(axis=0)
        np.testing.assert_allclose(hvd.allreduce(xs[me], name="now.args.default"), total / n, rtol=1e-12)  # Average
        np.testing.assert_array_equal(hvd.allreduce(xs[me], hvd.Sum, "now.args.positional", 0.5, 4.0), 2 * total)
        np.testing.assert_array_equal(hvd.allreduce(xs[me], postscale_factor=3.0, op=hvd.Sum, name="now.args.kw",
                                                    process_set=hvd.global_process_set), 3 * total)
        np.testing.assert_array_equal(hvd.allreduce(xs[me], hvd.Sum, prescale_factor=2.0), 2 * total)  # a generated name
        buf = xs[me].copy()
        assert hvd.allreduce_(buf, hvd.Min, "now.args.inplace") is buf
        np.testing.assert_array_equal(buf, np.stack(xs).min(axis=0))
        for bad in (lambda: hvd.allreduce(xs[me], bogus=1), lambda: hvd.allreduce(xs[me], hvd.Sum, "a", 1.0, 1.0, None, 7),
                    lambda: hvd.allreduce_()):
            try:  # refused before anything is submitted, alike on every rank
                bad()
            except TypeError:
                pass
            else:
                raise AssertionError("a malformed call was accepted")
        if n == 2:  # torch costs each rank seconds to import: once per run of the test
            import torch

            t = torch.tensor(xs[me])
            got = hvd.allreduce(t, op=hvd.Sum, postscale_factor=2.0, name="now.args.torch")
            assert isinstance(got, torch.Tensor), type(got)
            np.testing.assert_array_equal(got.numpy(), 2 * total)
            assert hvd.allreduce_(t, name="now.args.torch.inplace") is t  # the adapter's default: Average
            np.testing.assert_allclose(t.numpy(), total / n, rtol=1e-12)
    check.check("the verbs' argument forms", argument_forms)

    # 3. Errors through it arrive on every rank.
    def errors():
        x = np.ones(3, np.float64 if me == 0 else np.float32)
        try:
            hvd.allreduce(x, op=hvd.Sum, name="now.mismatch")
        except hvd.TensorMismatchError as e:
            assert "dtype" in str(e) or "type" in str(e), str(e)
        else:
            raise AssertionError("no TensorMismatchError")
        try:
            hvd.allreduce(np.ones(3, bool), op=hvd.Sum, name="now.bool.sum")
        except hvd.UnsupportedTypeError as e:
            assert "bool" in str(e), str(e)
        else:
            raise AssertionError("no UnsupportedTypeError for a bool Sum")
        np.testing.assert_array_equal(hvd.allreduce(np.ones(2, np.int32), op=hvd.Sum, name="now.after"),
                                      np.full(2, n, np.int32))
    check.check("errors on every rank", errors)

    hvd.shutdown()

    def stopped():
        try:
            hvd.allreduce(np.ones(2, np.float32))
        except (hvd.NotInitializedError, hvd.ShutdownError):
            pass
        else:
            raise AssertionError("an allreduce after shutdown() returned")
    check.check("after shutdown", stopped)
    check.finish()


if __name__ == "__main__":
    main()
