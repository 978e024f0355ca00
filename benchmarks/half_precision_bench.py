"""Half-precision allreduce against float32, per element: the same element count in float32,
float16 and bfloat16, Sum and Average, in interleaved rounds (medians of the slowest rank).

    mpirun -np 2 python benchmarks/half_precision_bench.py [--elements N] [--rounds R]

float16/bfloat16 are reduced in float by MPI user operations (csrc/host_math/half_math.cc: F16C or AVX2
vector code when the CPU has it, chosen at run time); they move half the bytes of float32.
"""
import argparse
import os
import time

import ml_dtypes
import numpy as np

import collectives as hvd
from collectives._loader import engine_module


def timed(x, op, name, reps):
    hvd.allreduce_(x, op=op, name=name)  # warm-up
    hvd.barrier()
    start = time.perf_counter()
    for _ in range(reps):
        hvd.allreduce_(x, op=op, name=name)
    mine = (time.perf_counter() - start) / reps
    return max(hvd.allgather_object(mine))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--elements", type=int, default=4 * 1024 * 1024)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--reps", type=int, default=5)
    args = parser.parse_args()
    hvd.init()
    dtypes = {"float32": np.float32, "float16": np.float16, "bfloat16": ml_dtypes.bfloat16}
    results = {(d, op): [] for d in dtypes for op in ("Sum", "Average")}
    for _ in range(args.rounds):
        for dname, dtype in dtypes.items():
            x = np.random.default_rng(hvd.rank()).random(args.elements).astype(dtype)
            for opname, op in (("Sum", hvd.Sum), ("Average", hvd.Average)):
                results[(dname, opname)].append(timed(x, op, f"half.{dname}.{opname}", args.reps))
    if hvd.rank() == 0:
        path = engine_module().half_math_for_testing(False, 0, np.zeros(1, np.uint16), np.zeros(1, np.uint16), 1.0,
                                                     False)
        print(f"np={hvd.size()}, {args.elements} elements, medians of {args.rounds} interleaved rounds, "
              f"half path: {path}, load average {os.getloadavg()[0]:.2f}")
        for opname in ("Sum", "Average"):
            base = np.median(results[("float32", opname)])
            for dname in dtypes:
                t = np.median(results[(dname, opname)])
                print(f"  {opname:7s} {dname:8s} {t * 1e3:8.2f} ms   {t / base:5.2f}x float32")
    hvd.shutdown()


if __name__ == "__main__":
    main()
