"""Stalls: one rank is late (or never comes) with a tensor the others wait on.

  stall_worker.py DIR delay [fresh|cached|both]
        rank 1 sleeps DELAY_S before submitting; rank 0 waits. Run with a stall check time
        below DELAY_S: rank 0 warns, then the op completes with the right result.
        'fresh': a name never used before; 'cached': a name that completed before (it sits
        in the response cache, so only the cache bits say it is pending).
  stall_worker.py DIR never WAITER [fresh|cached]
        rank WAITER submits a tensor no other rank ever submits. Run with a stall shutdown
        time: WAITER gets StallTimeoutError, the others see the engine stop, every rank exits
        (without calling shutdown) with status 0. 'cached': the name completed a few times
        before (every rank submitted it then), so it is in the response cache.
  stall_worker.py DIR crossed
        the classic deadlock: rank r waits on a tensor named for r that no other rank
        submits. Run with a stall shutdown time: every rank gets StallTimeoutError.

Each rank's stderr goes to DIR/stderr.<rank> (engine warnings included), so the test can
read rank 0's own stderr.
"""
import sys
import time

import numpy as np

import collectives as hvd
from common import Checker
from robust_util import expect_error, log, redirect_stderr, wait, wait_until

DELAY_S = 5.0


def main():
    directory, mode = sys.argv[1], sys.argv[2]
    redirect_stderr(directory)
    hvd.init()
    r, n = hvd.rank(), hvd.size()
    chk = Checker(r)
    if mode == "delay":
        which = sys.argv[3] if len(sys.argv) > 3 else "both"
        delay(r, n, chk, which)
        hvd.shutdown()
    elif mode == "crossed":
        def crossed():
            handle = hvd.allreduce_async(np.ones(4, np.float32), op=hvd.Sum, name=f"crossed.{r}")
            err, seconds = expect_error(handle, hvd.StallTimeoutError, 90, f"crossed.{r}")
            log(f"StallTimeoutError after {seconds:.1f} s: {err}")
            assert 2.0 <= seconds < 30, f"raised after {seconds:.1f} s (stall shutdown time: 3 s)"
            assert f"crossed.{r}" in str(err), str(err)
        chk.check("every rank of a deadlock gets StallTimeoutError", crossed)
    elif mode == "never":
        never(r, n, chk, int(sys.argv[3]), sys.argv[4] if len(sys.argv) > 4 else "fresh")
        # No shutdown(): the interpreter's exit must not hang after a stall shutdown.
    chk.finish()


def late_allreduce(r, n, name, value):
    """Rank 1 sleeps, then every rank allreduces; returns rank-local seconds spent waiting."""
    if r == 1:
        time.sleep(DELAY_S)
    t0 = time.monotonic()
    x = np.full((4,), r + value, dtype=np.float32)
    out = wait(hvd.allreduce_async(x, op=hvd.Sum, name=name), DELAY_S + 60, f"stalled {name}")
    np.testing.assert_array_equal(out, np.full((4,), n * value + n * (n - 1) / 2, dtype=np.float32))
    return time.monotonic() - t0


def delay(r, n, chk, which):
    if which in ("fresh", "both"):
        def fresh():
            seconds = late_allreduce(r, n, "stall.fresh", 1)
            log(f"stall.fresh completed after {seconds:.1f} s")
            if r == 0:
                assert seconds >= DELAY_S - 1.5, f"rank 0 waited only {seconds:.1f} s"
        chk.check("late rank, fresh name", fresh)

    if which in ("cached", "both"):
        def cached():
            for i in range(4):  # complete it a few times: the name is now cached everywhere
                x = np.full((4,), i, dtype=np.float32)
                out = wait(hvd.allreduce_async(x, op=hvd.Sum, name="stall.cached"), 30, "stall.cached warm-up")
                np.testing.assert_array_equal(out, np.full((4,), n * i, dtype=np.float32))
            seconds = late_allreduce(r, n, "stall.cached", 7)
            log(f"stall.cached completed after {seconds:.1f} s")
            # And it still works normally afterwards.
            out = wait(hvd.allreduce_async(np.ones(4, np.float32), op=hvd.Sum, name="stall.cached"), 30, "after")
            np.testing.assert_array_equal(out, np.full((4,), n, dtype=np.float32))
        chk.check("late rank, cached name", cached)


def never(r, n, chk, waiter, kind):
    name = "never.submitted" if kind == "fresh" else "never.cached"

    def warm():
        out = wait(hvd.allreduce_async(np.ones(2, np.float32), op=hvd.Sum, name="never.warm"), 30, "warm-up")
        np.testing.assert_array_equal(out, np.full(2, n, np.float32))
        if kind == "cached":
            for i in range(3):
                out = wait(hvd.allreduce_async(np.full(4, i, np.float32), op=hvd.Sum, name=name), 30, "cached warm-up")
                np.testing.assert_array_equal(out, np.full(4, n * i, np.float32))
    chk.check("warm-up", warm)

    if r == waiter:
        def stalled():
            handle = hvd.allreduce_async(np.ones(4, np.float32), op=hvd.Sum, name=name)
            err, seconds = expect_error(handle, hvd.StallTimeoutError, 90, name)
            log(f"StallTimeoutError after {seconds:.1f} s: {err}")
            assert isinstance(err, TimeoutError), type(err).__mro__
            assert seconds >= 2.0, f"raised after {seconds:.1f} s, before the stall shutdown time"
            assert seconds < 30, f"raised only after {seconds:.1f} s (stall shutdown time: 3 s)"
            assert name in str(err), str(err)
        chk.check("waiting rank gets StallTimeoutError", stalled)
    else:
        chk.check("engine stops on the idle ranks too",
                  lambda: wait_until(lambda: not hvd.is_initialized(), 90, "engine stop after stall shutdown"))

    def later_ops_fail():
        try:
            wait(hvd.allreduce_async(np.ones(2, np.float32), name="never.after"), 30, "op after stall shutdown")
        except hvd.CollectivesError as e:
            log(f"op after stall shutdown: {type(e).__name__}: {e}")
        else:
            raise AssertionError("an allreduce after the stall shutdown succeeded")
    chk.check("ops after the stall shutdown raise", later_ops_fail)
    assert not hvd.is_initialized()


if __name__ == "__main__":
    sys.exit(main())
