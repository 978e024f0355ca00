"""The small-allreduce fast path (csrc/negotiation/fused_negotiation.h, the common-call branch of collectives/requests.py):
results against numpy references from every rank's inputs, on the carried path, when not every
rank is ready, when ranks carry different entries, and next to the ordinary path.

Run with COLLECTIVES_LATENCY_STAGES=1: the engine then reports at shutdown how many allreduces
the negotiation carried and how many it discarded, which tests/engine/test_fast_path.py checks.
"""
import os
import time

import numpy as np

import collectives as hvd
from common import BFLOAT16, Checker, rank_input

INT_TYPES = [np.uint8, np.int8, np.int16, np.int32, np.int64]
FLOAT_TYPES = [np.float32, np.float64]
# Carried too, combined by the 16-bit reductions of their MPI operators (csrc/host_math/half_math.h).
HALF_TYPES = [np.dtype(np.float16)] + ([BFLOAT16] if BFLOAT16 is not None else [])
OPS = {"Sum": hvd.Sum, "Average": hvd.Average, "Min": hvd.Min, "Max": hvd.Max, "Product": hvd.Product}
# CarriedPayload::kMaxBytes through shared memory, FusedNegotiation::kPayloadBytes through MPI.
PAYLOAD_BYTES = 4096 if os.environ.get("COLLECTIVES_SHM_NEGOTIATION") == "0" else 16384


def reference(inputs, op_name, dtype):
    stack = np.stack(inputs)
    if op_name == "Sum":
        return stack.sum(axis=0, dtype=dtype)
    if op_name == "Product":
        return stack.prod(axis=0, dtype=dtype)
    if op_name == "Min":
        return stack.min(axis=0)
    if op_name == "Max":
        return stack.max(axis=0)
    total = stack.sum(axis=0, dtype=dtype)
    if np.dtype(dtype).kind == "f" or np.dtype(dtype) in HALF_TYPES:
        return total / len(inputs)
    return (np.trunc(total.astype(np.float64) / len(inputs))).astype(dtype)  # C++ integer division


def same(got, want, dtype):
    assert got.dtype == np.dtype(dtype) and got.shape == want.shape, (got.dtype, got.shape, want.shape)
    if np.dtype(dtype) in HALF_TYPES:
        # Sums and products of these small integers are exact; an Average's division is not
        # (the engine multiplies by 1/n in float, numpy divides in the 16-bit type).
        np.testing.assert_allclose(got.astype(np.float32), want.astype(np.float32), rtol=1e-2)
    elif np.dtype(dtype).kind == "f":
        np.testing.assert_allclose(got, want, rtol=1e-6)
    else:
        np.testing.assert_array_equal(got, want)


def inputs_for(seed, shape, dtype, op_name, n):
    low, high = (-3, 4) if op_name == "Product" else (-8, 8)
    return [rank_input(seed, r, shape, dtype, low, high) for r in range(n)]


def main():
    hvd.init()
    me, n = hvd.rank(), hvd.size()
    check = Checker(me)

    # 1. Every eligible dtype and op, below, at and above the payload limit, each name three
    #    times (the first goes through the coordinator, the later ones are cached: carried).
    seed = 0
    for dtype in INT_TYPES + FLOAT_TYPES + HALF_TYPES:
        limit = PAYLOAD_BYTES // np.dtype(dtype).itemsize
        for op_name, op in OPS.items():
            for count in (1, 7, limit, limit + 1):
                def case(dtype=dtype, op_name=op_name, op=op, count=count):
                    nonlocal seed
                    for it in range(3):
                        seed += 1
                        xs = inputs_for(seed, (count,), dtype, op_name, n)
                        got = hvd.allreduce(xs[me], op=op, name=f"fp.{np.dtype(dtype).name}.{op_name}.{count}")
                        same(got, reference(xs, op_name, dtype), dtype)
                check.check(f"{np.dtype(dtype).name} {op_name} x{count}", case)

    # 2. Scale factors, in place, async, a 2-d array and a non-contiguous view (general path).
    def scaled():
        for it in range(3):
            xs = inputs_for(100 + it, (3, 5), np.float32, "Sum", n)
            got = hvd.allreduce(xs[me], op=hvd.Sum, name="fp.scaled", prescale_factor=0.5, postscale_factor=3.0)
            np.testing.assert_allclose(got, np.stack(xs).sum(axis=0) * 1.5, rtol=1e-6)
    check.check("prescale and postscale", scaled)

    def inplace_and_async():
        for it in range(3):
            xs = inputs_for(200 + it, (6,), np.int32, "Sum", n)
            buf = xs[me].copy()
            assert hvd.allreduce_(buf, op=hvd.Sum, name="fp.inplace") is buf
            np.testing.assert_array_equal(buf, np.stack(xs).sum(axis=0))
            h = hvd.allreduce_async(xs[me], op=hvd.Max, name="fp.async")
            np.testing.assert_array_equal(hvd.synchronize(h), np.stack(xs).max(axis=0))
            wide = inputs_for(300 + it, (4, 6), np.float64, "Sum", n)
            view = wide[me][:, ::2]  # not contiguous: the general path
            np.testing.assert_allclose(hvd.allreduce(view, op=hvd.Sum, name="fp.view"),
                                       np.stack(wide).sum(axis=0)[:, ::2])
    check.check("in place, async, non-contiguous", inplace_and_async)

    # 3. Not every rank ready: rank 0 submits at once and its engine carries the entry alone
    #    (discarded); the others come 30 ms later, and the entry completes in a later cycle.
    def late():
        for it in range(6):
            xs = inputs_for(400 + it, (5,), np.float64, "Sum", n)
            hvd.barrier()
            if me != 0:
                time.sleep(0.03)
            got = hvd.allreduce(xs[me], op=hvd.Sum, name="fp.late")
            np.testing.assert_allclose(got, np.stack(xs).sum(axis=0))
    check.check("one rank late", late)

    # 4. Ranks carrying different entries: rank 0 starts with A, the others with B (both cached),
    #    so the descriptors differ and nothing is carried; then every rank submits the other one,
    #    and one of them is carried while the other runs on the ordinary path in the same cycle.
    def crossed():
        for it in range(6):
            a = inputs_for(500 + it, (4,), np.int64, "Sum", n)
            b = inputs_for(600 + it, (4,), np.int64, "Sum", n)
            hvd.barrier()
            first, second = (("fp.A", a), ("fp.B", b)) if me == 0 else (("fp.B", b), ("fp.A", a))
            h1 = hvd.allreduce_async(first[1][me], op=hvd.Sum, name=first[0])
            time.sleep(0.02)
            h2 = hvd.allreduce_async(second[1][me], op=hvd.Sum, name=second[0])
            np.testing.assert_array_equal(hvd.synchronize(h1), np.stack(first[1]).sum(axis=0))
            np.testing.assert_array_equal(hvd.synchronize(h2), np.stack(second[1]).sum(axis=0))
    check.check("ranks carrying different entries", crossed)

    # 5. A cached name resubmitted with another shape on the last rank: the carried result is
    #    discarded, the entry invalidated, and every rank gets the coordinator's mismatch error.
    def mismatch():
        x = np.ones(4, np.float32)
        hvd.allreduce(x, op=hvd.Sum, name="fp.mm")
        hvd.allreduce(x, op=hvd.Sum, name="fp.mm")
        y = np.ones(5 if me == n - 1 else 4, np.float32)
        try:
            hvd.allreduce(y, op=hvd.Sum, name="fp.mm")
        except hvd.TensorMismatchError as e:
            assert "shape" in str(e), str(e)
        else:
            raise AssertionError("no TensorMismatchError on this rank")
        np.testing.assert_array_equal(hvd.allreduce(x, op=hvd.Sum, name="fp.after"), np.full(4, n, np.float32))
    check.check("shape changed on one rank", mismatch)

    check.finish()


if __name__ == "__main__":
    main()
