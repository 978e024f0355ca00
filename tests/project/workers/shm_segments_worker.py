"""A job for tests/project/test_shm_leftovers.py: every rank initialises the engine (MPICH makes its
intra-host segments then), checks one allreduce against numpy, and writes the MPICH segments it
maps to ``<report>.rank<r>``. Then either ``--die-rank R`` SIGKILLs itself (MPICH's launcher kills
the others: nobody reaches MPI_Finalize, so the segments stay behind unless the launcher removes
them), or every rank waits for the file ``--wait-for`` (a job running beside another) and
exits normally.
"""
import argparse
import os
import signal
import sys
import time

import numpy as np

import collectives as hvd


def mapped_segments():
    with open("/proc/self/maps") as f:
        paths = {line.split(None, 5)[-1].strip() for line in f if "/dev/shm/mpich_" in line}
    return sorted(p.removesuffix(" (deleted)") for p in paths)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--report", required=True)
    p.add_argument("--die-rank", type=int, default=-1)
    p.add_argument("--wait-for", default="")
    p.add_argument("--wait-limit", type=float, default=60.0)
    a = p.parse_args()
    hvd.init()
    rank, size = hvd.rank(), hvd.size()
    got = hvd.allreduce(np.arange(4, dtype=np.float64) * (rank + 1), op=hvd.Sum, name="shm.check")
    assert np.array_equal(got, np.arange(4) * sum(range(1, size + 1))), got
    tmp = f"{a.report}.rank{rank}.tmp"
    with open(tmp, "w") as f:
        f.write("\n".join(mapped_segments()) + "\n")
    os.replace(tmp, f"{a.report}.rank{rank}")
    hvd.barrier()
    if rank == a.die_rank:
        os.kill(os.getpid(), signal.SIGKILL)
    if a.wait_for:
        deadline = time.monotonic() + a.wait_limit
        while not os.path.exists(a.wait_for):
            if time.monotonic() > deadline:
                print(f"rank {rank}: {a.wait_for} never came", file=sys.stderr, flush=True)
                sys.exit(3)
            time.sleep(0.1)
    if a.die_rank >= 0:
        time.sleep(30)  # a survivor: MPICH's launcher kills it once the other rank died
    hvd.shutdown()
    print(f"rank {rank}: ok", flush=True)


if __name__ == "__main__":
    main()
