"""Allreduce and allgather against numpy references, for tests/engine/test_hierarchical.py.

Run with or without COLLECTIVES_HIERARCHICAL_ALLREDUCE / _ALLGATHER, on one host or on
simulated hosts: the results must be the same (exactly, for integer-valued inputs, whose sums
are exact in every dtype). Each case prints a digest of its result on rank 0
("digest LABEL HEX") so that the test can compare a hierarchical run with a flat one.

Cases: every dtype x op (bool: Min, Max) with prescale/postscale, at sizes below the local
size (the flat fallback), odd sizes (unaligned shards) below and above 8 KiB (on one host the
larger ones take the shared-memory allreduce, csrc/algorithms/shm_allreduce.h), and several pipeline pieces; fused
groups; random float inputs against a float64 reference within tolerance; a joined rank
contributing zeros; a process set spanning the hosts (flat: not the whole job); allgather of
every dtype with first dimensions that differ by rank (one rank contributing none).

``traffic``: the ranks with local rank 0 read their host's eth0 counters around allreduces
and allgathers of a known size and print the bytes each host sent ("egress ..."): the test
checks them against the wire bound.
"""
import hashlib
import os
import sys
import zlib

import numpy as np

import collectives as hvd
from common import ALL_DTYPES, BFLOAT16, Checker, rank_input

OPS = {"Sum": hvd.Sum, "Average": hvd.Average, "Min": hvd.Min, "Max": hvd.Max, "Product": hvd.Product}
BOOL = np.dtype(np.bool_)
HALF = [np.dtype(np.float16)] + ([BFLOAT16] if BFLOAT16 is not None else [])
SCALES = {"Sum": (0.5, 3.0), "Average": (1.0, 2.0), "Min": (2.0, 1.0), "Max": (1.0, 2.0), "Product": (1.0, 2.0)}
# Elements: fewer than the local ranks (flat fallback), an odd count (uneven shards), and
# 2.5 pipeline pieces of 4 MiB for 4-byte types (csrc/algorithms/hierarchical.cc: kPieceBytes).
SMALL, ODD, ODD_LARGE = 1, 1001, 9001
BIG_BYTES = 10 << 20
# The multi-piece cases (each rank computes every rank's input, so not every combination).
BIG = {("float32", "Sum"), ("float32", "Average"), ("int32", "Min"), ("float16", "Sum"), ("bfloat16", "Average"),
       ("float64", "Product")}

R = S = None
chk = None


def inputs(label, shape, dt, low=-8, high=8):
    return [rank_input(zlib.crc32(label.encode()), r, shape, dt, low, high) for r in range(S)]


def reference(xs, dt, op, pre, post, ranks=None):
    """float64 reference of an allreduce of xs over ``ranks`` (default: all), as Horovod computes it:
    prescale, reduce, Average divides by the set's size, postscale; integers truncate."""
    dt = np.dtype(dt)
    ranks = list(range(S)) if ranks is None else ranks
    if dt == BOOL:
        stack = np.stack([xs[r] for r in ranks])
        return stack.all(axis=0) if op == hvd.Min else stack.any(axis=0)
    integer = dt.kind in "iu"
    stack = np.stack([xs[r].astype(np.float64) for r in ranks])
    if pre != 1.0:
        stack = stack * pre
        if integer:
            stack = np.trunc(stack)
    if op in (hvd.Sum, hvd.Average):
        out = stack.sum(axis=0)
    elif op == hvd.Min:
        out = stack.min(axis=0)
    elif op == hvd.Max:
        out = stack.max(axis=0)
    else:
        out = stack.prod(axis=0)
    if op == hvd.Average:
        out = np.trunc(out / len(ranks)) if integer else out / len(ranks)
    if post != 1.0:
        out = out * post
        if integer:
            out = np.trunc(out)
    return out


# Integer-valued inputs: sums and products are exact in every dtype, so integers must match
# exactly; float results are also scaled (Average, postscale), rounded in the dtype's arithmetic.
TOLERANCE = {"float16": 1e-2, "bfloat16": 2e-2, "float32": 1e-6, "float64": 1e-12}


def assert_equal(got, expected, dt, what):
    assert got.dtype == np.dtype(dt), f"{what}: dtype {got.dtype}"
    assert got.shape == expected.shape, f"{what}: shape {got.shape} != {expected.shape}"
    tol = TOLERANCE.get(np.dtype(dt).name, 0)
    np.testing.assert_allclose(got.astype(np.float64), expected.astype(np.float64), rtol=tol, atol=tol, err_msg=what)


def digest(label, arr):
    if R == 0:
        print(f"digest {label} {hashlib.sha1(np.ascontiguousarray(arr).tobytes()).hexdigest()}", flush=True)


def allreduce_cases():
    for dt in ALL_DTYPES:
        for opname, op in OPS.items():
            if dt == BOOL and op not in (hvd.Min, hvd.Max):
                continue
            pre, post = (1.0, 1.0) if dt == BOOL else SCALES[opname]
            low, high = (-2, 3) if op == hvd.Product else (-8, 8)
            big = BIG_BYTES // dt.itemsize if (dt.name, opname) in BIG else 0
            for n in (SMALL, ODD, ODD_LARGE, big):
                if not n:
                    continue
                label = f"allreduce {dt.name} {opname} n={n}"

                def one(label=label, n=n, dt=dt, op=op, pre=pre, post=post, low=low, high=high):
                    xs = inputs(label, (n,), dt, low, high)
                    got = hvd.allreduce(xs[R], op=op, name=label, prescale_factor=pre, postscale_factor=post)
                    assert_equal(got, reference(xs, dt, op, pre, post), dt, label)
                    digest(label, got)

                chk.check(label, one)


def fused_cases():
    # Small tensors submitted together share one fusion buffer (and one hierarchical allreduce).
    for dt in [np.dtype(np.float32), np.dtype(np.int32)] + HALF:
        for opname in ("Sum", "Average"):
            label = f"fused {dt.name} {opname}"

            def one(label=label, dt=dt, opname=opname):
                op = OPS[opname]
                pre, post = SCALES[opname]
                shapes = [(3,), (1,), (257,), (64, 9), (5, 5)]
                xss = [inputs(f"{label}.{i}", s, dt) for i, s in enumerate(shapes)]
                got = hvd.grouped_allreduce([xs[R] for xs in xss], op=op, name=label, prescale_factor=pre,
                                            postscale_factor=post)
                for i, (g, xs) in enumerate(zip(got, xss)):
                    assert_equal(g, reference(xs, dt, op, pre, post), dt, f"{label} tensor {i}")
                    digest(f"{label}.{i}", g)
                # The same tensors as separate async submissions (fused by the engine's cycle).
                handles = [hvd.allreduce_async(xs[R], op=op, name=f"{label}.async{i}") for i, xs in enumerate(xss)]
                for i, (h, xs) in enumerate(zip(handles, xss)):
                    assert_equal(hvd.synchronize(h), reference(xs, dt, op, 1.0, 1.0), dt, f"{label} async {i}")

            chk.check(label, one)


def float_cases():
    # Non-integer values: the order of additions differs from the flat algorithm's, so the
    # comparison is to float64 within the dtype's rounding.
    tolerance = {np.dtype(np.float32): 1e-5, np.dtype(np.float64): 1e-12, np.dtype(np.float16): 1e-2}
    if BFLOAT16 is not None:
        tolerance[BFLOAT16] = 2e-2
    for dt, tol in tolerance.items():
        for n in (ODD, BIG_BYTES // dt.itemsize if dt.name in ("float32", "bfloat16") else 0):
            if not n:
                continue
            label = f"random {dt.name} Average n={n}"

            def one(label=label, dt=dt, tol=tol, n=n):
                rngs = [np.random.default_rng([zlib.crc32(label.encode()), r]) for r in range(S)]
                xs = [g.standard_normal(n).astype(dt) for g in rngs]
                got = hvd.allreduce(xs[R], op=hvd.Average, name=label)
                expected = reference(xs, dt, hvd.Average, 1.0, 1.0)
                np.testing.assert_allclose(got.astype(np.float64), expected, rtol=tol, atol=tol, err_msg=label)

            chk.check(label, one)


def join_case():
    # The last rank joins at once; the others allreduce: it contributes zeros through the same
    # (hierarchical) algorithm, or every rank would wait for ever.
    label = "joined rank contributes zeros"

    def one():
        dt = np.dtype(np.float32)
        xs = inputs(label, (300_000,), dt)
        last = S - 1
        if R != last:
            got = hvd.allreduce(xs[R], op=hvd.Sum, name=label)
            expected = reference(xs, dt, hvd.Sum, 1.0, 1.0, ranks=list(range(last)))
            assert_equal(got, expected, dt, label)
        assert 0 <= hvd.join() < S

    chk.check(label, one)


def process_set_case():
    # Ranks 0 and S-1: on different hosts when there are several; a process set runs flat.
    label = "process set allreduce"

    def one():
        ps = hvd.add_process_set([0, S - 1])
        try:
            if R in (0, S - 1):
                dt = np.dtype(np.int32)
                xs = inputs(label, (4099,), dt)
                got = hvd.allreduce(xs[R], op=hvd.Sum, name=label, process_set=ps)
                assert_equal(got, reference(xs, dt, hvd.Sum, 1.0, 1.0, ranks=[0, S - 1]), dt, label)
        finally:
            hvd.remove_process_set(ps)

    chk.check(label, one)


def rows_of(r, base):
    return 0 if r == 1 else base + r  # rank 1 contributes no rows


def allgather_cases():
    for dt in ALL_DTYPES:
        for base, width in ((1, 3), (2000, 129)):
            label = f"allgather {dt.name} rows={base}+r width={width}"

            def one(label=label, dt=dt, base=base, width=width):
                xs = [rank_input(zlib.crc32(label.encode()), r, (rows_of(r, base), width), dt) for r in range(S)]
                got = hvd.allgather(xs[R], name=label)
                expected = np.concatenate(xs)
                assert got.dtype == dt and got.shape == expected.shape, f"{label}: {got.dtype} {got.shape}"
                assert got.tobytes() == expected.tobytes(), label
                digest(label, got)

            chk.check(label, one)


def egress_bytes():
    with open("/sys/class/net/eth0/statistics/tx_bytes") as f:
        return int(f.read())


def traffic():
    """Bytes each host sent for 3 allreduces of 8 MiB and 3 allgathers of 8 MiB results: printed
    by the host's first rank, as "egress OP HOST BYTES PAYLOAD"."""
    payload = 8 << 20
    x = np.ones(payload // 4, dtype=np.float32)
    share = np.ones((payload // 1024 // S, 256), dtype=np.float32)  # 1 KiB rows; S shares make the payload
    runs = (("allreduce", lambda i: hvd.allreduce(x, op=hvd.Sum, name=f"traffic.ar.{i}")),
            ("allgather", lambda i: hvd.allgather(share, name=f"traffic.ag.{i}")))

    def one():
        for name, run in runs:
            run(-1)  # warm: buffers, connections
            hvd.barrier()
            before = egress_bytes()
            for i in range(3):
                run(i)
            hvd.barrier()
            sent = egress_bytes() - before
            if hvd.local_rank() == 0:
                print(f"egress {name} {os.uname().nodename} {sent} {3 * payload}", flush=True)

    chk.check("traffic", one)


def main():
    global R, S, chk
    hvd.init()
    R, S = hvd.rank(), hvd.size()
    chk = Checker(R)
    print(f"[rank {R}] on {os.uname().nodename}", flush=True)
    parts = sys.argv[1:] or ["allreduce", "fused", "float", "join", "process_set", "allgather"]
    for part in parts:
        {"allreduce": allreduce_cases, "fused": fused_cases, "float": float_cases, "join": join_case,
         "process_set": process_set_case, "allgather": allgather_cases, "traffic": traffic}[part]()
    hvd.barrier()
    chk.finish()


if __name__ == "__main__":
    main()
