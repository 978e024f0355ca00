"""Allreduce against raw mpi4py in interleaved rounds: the ratio that issue 14 asks about.

Run with:  mpirun -np 2 python benchmarks/interleaved_bench.py [--rounds 7] [--max-mib 256] [--stages]

Each round measures, for every size, raw mpi4py ``Allreduce`` (in place and out of place) and
collectives' ``allreduce_`` / ``allreduce`` right after one another, so that a noisy machine
slows both alike; the report gives, per size, the median over rounds of each column and the
median of the per-round ratios (ours / mpi4py). A repetition's time is the slowest rank's,
every repetition starts after a barrier (as benchmarks/allreduce_bench.py).

``--stages`` (with ``COLLECTIVES_LATENCY_STAGES=1`` in the environment) also prints the engine's
per-stage breakdown of the small allreduces (csrc/monitor/latency_stages.h).
"""
import argparse
import os
import sys
import time

import numpy as np
from mpi4py import MPI

import collectives as hvd

comm = MPI.COMM_WORLD
RANK, SIZE = comm.Get_rank(), comm.Get_size()
KiB, MiB = 1024, 1024 * 1024
EXPECTED = SIZE * (SIZE + 1) / 2


def timed(fn, reps, setup=None):
    times = np.empty(reps)
    for i in range(reps):
        if setup is not None:
            setup()
        comm.Barrier()
        t0 = time.perf_counter()
        fn()
        times[i] = time.perf_counter() - t0
    comm.Allreduce(MPI.IN_PLACE, times, op=MPI.MAX)
    return float(np.median(times))


def reps_for(nbytes):
    if nbytes <= 64 * KiB:
        return 300
    if nbytes <= MiB:
        return 40
    if nbytes <= 16 * MiB:
        return 8
    return 3


def one_round(sizes, failures):
    row = {}
    for nbytes in sizes:
        n = max(1, nbytes // 4)
        x = np.full(n, RANK + 1, dtype=np.float32)
        y = np.empty_like(x)
        recv = np.empty_like(x)
        reps = reps_for(nbytes)
        refill = lambda: np.copyto(y, x)  # noqa: E731
        name = f"ib.{nbytes}"
        res = {}
        # Warm-up of each variant (first-call costs: negotiation of a new name, page faults).
        comm.Allreduce(x, recv, op=MPI.SUM)
        hvd.allreduce(x, op=hvd.Sum, name=name)
        refill()
        hvd.allreduce_(y, op=hvd.Sum, name=name + "_")
        res["mpi4py_"] = timed(lambda: comm.Allreduce(MPI.IN_PLACE, y, op=MPI.SUM), reps, refill)
        res["ours_"] = timed(lambda: hvd.allreduce_(y, op=hvd.Sum, name=name + "_"), reps, refill)
        if not np.all(y == EXPECTED):
            failures.append(f"rank {RANK}: ours_ {nbytes} B wrong: {y[:4]}")
        res["mpi4py"] = timed(lambda: comm.Allreduce(x, recv, op=MPI.SUM), reps)
        out = [None]

        def ours():
            out[0] = None
            out[0] = hvd.allreduce(x, op=hvd.Sum, name=name)

        res["ours"] = timed(ours, reps)
        if not np.all(out[0] == EXPECTED):
            failures.append(f"rank {RANK}: ours {nbytes} B wrong: {out[0][:4]}")
        row[nbytes] = res
        del x, y, recv, out
    return row


def python_prep_cost(reps=2000):
    """The Python work of one allreduce before it reaches the engine (name, conversion, output
    allocation, argument checks), timed alone: the engine's own stages print at shutdown."""
    from collectives import ops, requests

    x = np.full(2, 1.0, dtype=np.float32)
    numpy_one = np.float64(1.0)
    t0 = time.perf_counter()
    for _ in range(reps):
        name = ops._name("ib.prep", "allreduce", None)
        requests.allreduce(x, name, hvd.Sum, 1.0, 1.0, False)
    fast = (time.perf_counter() - t0) / reps
    t0 = time.perf_counter()
    for _ in range(reps):
        name = ops._name("ib.prep", "allreduce", None)
        requests.allreduce(x, name, hvd.Sum, numpy_one, 1.0, False)  # a numpy scale factor: the general checks
    general = (time.perf_counter() - t0) / reps
    return (f"python before enqueue (8 B): {fast * 1e6:.2f} us (general path {general * 1e6:.2f} us)")


def fmt(s):
    return f"{s * 1e6:8.1f} us" if s < 1e-3 else f"{s * 1e3:8.2f} ms"


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--max-mib", type=int, default=256, help="largest size in MiB (default 256)")
    parser.add_argument("--stages", action="store_true", help="print the engine's stage breakdown at the end")
    parser.add_argument("--small", action="store_true", help="only 8 B and 4 KiB (the latency cases)")
    parser.add_argument("--sizes", help="comma-separated sizes in bytes (e.g. 2048,8192), instead of the default list")
    args = parser.parse_args()
    sizes = [8, KiB, 4 * KiB, 64 * KiB, MiB, 4 * MiB, 16 * MiB, 64 * MiB, 256 * MiB]
    sizes = [s for s in sizes if s <= args.max_mib * MiB]
    if args.small:
        sizes = [8, 4 * KiB]
    if args.sizes:
        sizes = [int(s) for s in args.sizes.split(",")]
    hvd.init()
    load0 = os.getloadavg()[0]
    rounds, failures = [], []
    for _ in range(args.rounds):
        rounds.append(one_round(sizes, failures))
    load1 = os.getloadavg()[0]
    stages = python_prep_cost() if args.stages else None
    all_stages = comm.gather(stages, root=0)
    all_failures = comm.gather(failures, root=0)
    if RANK == 0:
        print(f"np={SIZE}, {args.rounds} interleaved rounds, load average {load0:.2f} -> {load1:.2f}")
        print(f"{'size':>9} | {'mpi4py_ (in place)':>18} {'ours_':>11} {'ratio':>6} | "
              f"{'mpi4py (out)':>12} {'ours':>11} {'ratio':>6}")
        for nbytes in sizes:
            col = {k: [r[nbytes][k] for r in rounds] for k in ("mpi4py_", "ours_", "mpi4py", "ours")}
            r_in = np.median([a / b for a, b in zip(col["ours_"], col["mpi4py_"])])
            r_out = np.median([a / b for a, b in zip(col["ours"], col["mpi4py"])])
            label = (f"{nbytes} B" if nbytes < KiB or nbytes % KiB else f"{nbytes // KiB} KiB" if nbytes < MiB or nbytes % MiB
                     else f"{nbytes // MiB} MiB")
            print(f"{label:>9} | {fmt(np.median(col['mpi4py_'])):>18} {fmt(np.median(col['ours_'])):>11} "
                  f"{r_in:5.2f}x | {fmt(np.median(col['mpi4py'])):>12} {fmt(np.median(col['ours'])):>11} {r_out:5.2f}x")
        for r, st in enumerate(all_stages):
            if st:
                print(f"rank {r} stages: {st}")
        bad = [f for per in all_failures for f in per]
        if bad:
            print("WRONG RESULTS:\n  " + "\n  ".join(bad))
    hvd.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
