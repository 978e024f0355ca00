"""Small in-place allreduces of float16 and float32 by size, through collectives (numpy arrays).

    mpirun -np 2 .venv/bin/python benchmarks/half_precision_sizes.py [--rounds 5] [--calls 2000]

For each round, dtype and size: 50 warm-up calls, a barrier, then the mean time per call of a
loop of --calls `allreduce_` calls; rank 0 prints the median over rounds (and the range). The
sizes straddle the limits of the paths a small allreduce can take: carried by the negotiation
(up to 16 KiB on one host), the shared-memory allreduce (from 8 KiB). To compare two builds,
run this once per build alternately, switching with PYTHONPATH (docs/performance-history.md).
"""
import argparse
import time

import numpy as np

import collectives as hvd

SIZES = [2048, 4096, 6144, 8192, 12288, 16384]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--calls", type=int, default=2000)
    args = parser.parse_args()
    hvd.init()
    times = {}
    for _ in range(args.rounds):
        for dtype in (np.dtype(np.float16), np.dtype(np.float32)):
            for nbytes in SIZES:
                a = np.ones(nbytes // dtype.itemsize, dtype)
                name = f"sizes.{dtype.name}.{nbytes}"
                for _ in range(50):
                    hvd.allreduce_(a, op=hvd.Sum, name=name)
                hvd.allreduce(np.zeros(1, np.float32), name="sizes.barrier")
                start = time.perf_counter()
                for _ in range(args.calls):
                    hvd.allreduce_(a, op=hvd.Sum, name=name)
                times.setdefault((dtype.name, nbytes), []).append((time.perf_counter() - start) / args.calls * 1e6)
    if hvd.rank() == 0:
        for (dtype, nbytes), v in sorted(times.items()):
            print(f"{dtype:8s} {nbytes:6d} B  median {np.median(v):6.1f} us  ({min(v):.1f}-{max(v):.1f})")
    hvd.shutdown()


if __name__ == "__main__":
    main()
