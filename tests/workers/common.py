"""Helpers for worker scripts (run under mpirun, one process per rank)."""
import sys
import traceback

import numpy as np

try:
    import ml_dtypes

    BFLOAT16 = np.dtype(ml_dtypes.bfloat16)
except ImportError:  # pragma: no cover - ml_dtypes is a test dependency
    BFLOAT16 = None

ALL_DTYPES = [np.dtype(t) for t in (np.uint8, np.int8, np.int16, np.int32, np.int64, np.float16, np.float32,
                                    np.float64, np.bool_)] + ([BFLOAT16] if BFLOAT16 is not None else [])


def rank_input(seed, rank, shape, dtype, low=-8, high=8):
    """The input rank ``rank`` uses for case ``seed``: integers in [low, high) (so sums of a
    few ranks are exact in every dtype), the same on every rank that recomputes it."""
    rng = np.random.default_rng([seed, rank])
    dtype = np.dtype(dtype)
    if dtype == np.bool_:
        return rng.integers(0, 2, size=shape).astype(np.bool_)
    if dtype.kind == "u":
        low = max(low, 0)
    return rng.integers(low, high, size=shape).astype(dtype)


class Checker:
    """Collects failures instead of stopping at the first, and reports them at the end."""

    def __init__(self, rank):
        self.rank = rank
        self.failures = []
        self.count = 0

    def check(self, label, fn):
        self.count += 1
        try:
            fn()
        except Exception:  # noqa: BLE001 - every failure is reported with its traceback
            self.failures.append(f"[rank {self.rank}] {label}\n{traceback.format_exc()}")

    def finish(self):
        for f in self.failures:
            print(f, file=sys.stderr)
        print(f"[rank {self.rank}] {self.count - len(self.failures)} passed, {len(self.failures)} failed")
        sys.exit(1 if self.failures else 0)
