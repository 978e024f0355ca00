"""Helpers for worker scripts (run under mpirun, one process per rank)."""
import os
import sys
import time
import traceback

import numpy as np

try:
    import ml_dtypes

    BFLOAT16 = np.dtype(ml_dtypes.bfloat16)
except ImportError:  # pragma: no cover - ml_dtypes is a test dependency
    BFLOAT16 = None

ALL_DTYPES = [np.dtype(t) for t in (np.uint8, np.int8, np.int16, np.int32, np.int64, np.float16, np.float32,
                                    np.float64, np.bool_)] + ([BFLOAT16] if BFLOAT16 is not None else [])


def raises(exc, fn, text=""):
    """Calls ``fn``, which must raise ``exc`` with ``text`` in its message; returns the error."""
    try:
        fn()
    except exc as e:
        assert text in str(e), f"{text!r} not in {e!r}"
        return e
    raise AssertionError(f"expected {exc.__name__}")


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


def assert_close_to_reference(values, expected, kind, what):
    """A result's values (numpy: bool, or float64) against its numpy reference. ``kind``: "bool",
    "half" (float16 and bfloat16: 1e-2), "float" (1e-6) or "int" (exact). The frameworks'
    workers check their own tensor types and dtypes, then call this."""
    if kind == "bool":
        np.testing.assert_array_equal(values, np.asarray(expected).astype(bool), err_msg=what)
    elif kind in ("half", "float"):
        tolerance = 1e-2 if kind == "half" else 1e-6
        np.testing.assert_allclose(values, expected, rtol=tolerance, atol=tolerance, err_msg=what)
    else:
        np.testing.assert_array_equal(values, expected, err_msg=what)


class Checker:
    """Collects failures instead of stopping at the first, and reports them at the end."""

    def __init__(self, rank):
        self.rank = rank
        self.failures = []
        self.count = 0
        # CHECKER_TIMES=1: each check's seconds on stderr at the end (where CI's time goes).
        self.times = [] if os.environ.get("CHECKER_TIMES") else None

    def check(self, label, fn):
        self.count += 1
        start = time.perf_counter()
        try:
            fn()
        except Exception:  # noqa: BLE001 - every failure is reported with its traceback
            self.failures.append(f"[rank {self.rank}] {label}\n{traceback.format_exc()}")
        if self.times is not None:
            self.times.append((time.perf_counter() - start, label))

    def finish(self):
        for f in self.failures:
            print(f, file=sys.stderr)
        for seconds, label in sorted(self.times or [], reverse=True):
            print(f"[rank {self.rank}] {seconds:7.2f} s  {label}", file=sys.stderr)
        print(f"[rank {self.rank}] {self.count - len(self.failures)} passed, {len(self.failures)} failed")
        sys.exit(1 if self.failures else 0)
