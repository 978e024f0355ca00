"""More than 2**31 elements in one collective (np=2): the engine must use large counts (or
chunk) correctly. One 2 GiB buffer per rank, reused for every step.

  large_worker.py          allreduce_ (uint8, then int8 view) and broadcast_ of > 2**31 bytes
"""
import sys
import time

import numpy as np

import collectives as hvd
from common import Checker
from robust_util import wait

N = 2**31 + 5
CHUNK = 1 << 26
# Positions that straddle the 32-bit boundaries; each rank writes a marker there.
MARKS = [0, 1, 2**31 - 2, 2**31 - 1, 2**31, 2**31 + 1, N - 1]


def check_uniform(arr, value, skip=()):
    """Every element equals ``value`` (positions in ``skip`` excepted), in cheap chunks."""
    saved = {i: arr[i] for i in skip}
    for i in skip:
        arr[i] = value
    try:
        for off in range(0, arr.size, CHUNK):
            part = arr[off:off + CHUNK]
            lo, hi = part.min(), part.max()
            assert lo == value and hi == value, f"chunk at {off}: min {lo}, max {hi}, expected {value}"
    finally:
        for i, v in saved.items():
            arr[i] = v


def main():
    hvd.init()
    r, n = hvd.rank(), hvd.size()
    chk = Checker(r)
    buf = np.empty(N, dtype=np.uint8)  # the one large tensor of this rank

    def allreduce_uint8():
        buf.fill(1)
        for k, i in enumerate(MARKS):
            buf[i] = 1 + k + r  # sums to 2 + 2k + (0 + 1 + ... ) at np=2
        t0 = time.monotonic()
        out = wait(hvd.allreduce_async_(buf, op=hvd.Sum, name="large.u8"), 400, "large uint8 allreduce")
        print(f"[rank {r}] uint8 allreduce of {N} elements: {time.monotonic() - t0:.1f} s", flush=True)
        assert out is buf
        ranks_sum = n * (n - 1) // 2
        for k, i in enumerate(MARKS):
            assert int(buf[i]) == n * (1 + k) + ranks_sum, f"position {i}: {buf[i]}"
        check_uniform(buf, n, skip=MARKS)
        total = int(buf.sum(dtype=np.int64))
        expected = n * (N - len(MARKS)) + sum(n * (1 + k) + ranks_sum for k in range(len(MARKS)))
        assert total == expected, f"checksum {total} != {expected}"

    def allreduce_int8():
        v = buf.view(np.int8)
        v.fill(-1)
        for k, i in enumerate(MARKS):
            v[i] = -(k + 1) if r == 0 else k + 3
        t0 = time.monotonic()
        wait(hvd.allreduce_async_(v, op=hvd.Sum, name="large.i8"), 400, "large int8 allreduce")
        print(f"[rank {r}] int8 allreduce: {time.monotonic() - t0:.1f} s", flush=True)
        for k, i in enumerate(MARKS):
            expected = -(k + 1) + (k + 3) * (n - 1)
            assert int(v[i]) == expected, f"position {i}: {v[i]} != {expected}"
        check_uniform(v, -n, skip=MARKS)

    def broadcast_large():
        root = n - 1
        if r == root:
            buf.fill(9)
            for k, i in enumerate(MARKS):
                buf[i] = 100 + k
        else:
            buf.fill(0)
        t0 = time.monotonic()
        wait(hvd.broadcast_async_(buf, root, name="large.bcast"), 400, "large broadcast")
        print(f"[rank {r}] broadcast of {N} bytes: {time.monotonic() - t0:.1f} s", flush=True)
        for k, i in enumerate(MARKS):
            assert int(buf[i]) == 100 + k, f"position {i}: {buf[i]}"
        check_uniform(buf, 9, skip=MARKS)

    chk.check("allreduce_ uint8 of 2**31 + 5 elements", allreduce_uint8)
    chk.check("allreduce_ int8 of 2**31 + 5 elements", allreduce_int8)
    chk.check("broadcast_ of 2**31 + 5 bytes", broadcast_large)
    hvd.shutdown()
    chk.finish()


if __name__ == "__main__":
    sys.exit(main())
