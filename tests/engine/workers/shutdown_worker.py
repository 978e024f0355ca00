"""Shutdown with work pending, and interpreter exit without shutdown().

  shutdown_worker.py peer_shutdown   rank 0 has an op only it submitted; rank 1 calls
                                     shutdown(): rank 0's synchronize raises ShutdownError
  shutdown_worker.py self_shutdown   rank 0 has such an op and calls shutdown() itself: the
                                     handle fails with ShutdownError; rank 1's engine stops
  shutdown_worker.py peer_exit       like peer_shutdown, but rank 1 just exits (atexit)
  shutdown_worker.py exit_clean      init, one op, exit without shutdown()
  shutdown_worker.py exit_pending    rank 0 exits with an async op pending (never synchronized)
  shutdown_worker.py reinit          shutdown() then init() again: the engine works again
  shutdown_worker.py thread_blocked  a thread of rank 0 is blocked in a synchronous allreduce
                                     only rank 0 submitted; rank 0's main thread calls
                                     shutdown(): the thread gets ShutdownError
  shutdown_worker.py exit_daemon     the same blocked thread (a daemon), and the main thread
                                     simply returns: the process must still exit

Every mode must end with exit status 0 on every rank, within the test's timeout.
"""
import sys
import threading
import time

import numpy as np

import collectives as hvd
from common import Checker
from robust_util import expect_error, log, wait, wait_until

F32 = np.float32


def sum_allreduce(name, n, r):
    out = wait(hvd.allreduce_async(np.full(3, r + 1, F32), op=hvd.Sum, name=name), 30, name)
    np.testing.assert_array_equal(out, np.full(3, n * (n + 1) / 2, F32))


def ops_fail_after_stop(chk, label):
    """Once the engine has stopped, an op raises (quickly) instead of hanging."""
    def run():
        try:
            wait(hvd.allreduce_async(np.ones(2, F32), name=f"after.{label}"), 30, f"op after {label}")
        except hvd.CollectivesError as e:
            log(f"op after {label}: {type(e).__name__}: {e}")
            return e
        raise AssertionError(f"an allreduce after {label} succeeded")
    chk.check(f"ops raise after {label}", run)


def main():
    mode = sys.argv[1]
    hvd.init()
    r, n = hvd.rank(), hvd.size()
    chk = Checker(r)

    if mode in ("peer_shutdown", "peer_exit"):
        orphan = None
        if r == 0:
            orphan = hvd.allreduce_async(np.ones(4, F32), op=hvd.Sum, name="orphan")
        # Both ranks complete an op after the orphan was submitted: it is surely queued.
        chk.check("op beside the orphan", lambda: sum_allreduce("beside", n, r))
        if r == 0:
            def orphan_fails():
                err, seconds = expect_error(orphan, hvd.ShutdownError, 60, "orphan")
                log(f"orphan failed after {seconds:.2f} s: {err}")
                assert "orphan" in str(err), str(err)
            chk.check("pending op fails with ShutdownError", orphan_fails)
            ops_fail_after_stop(chk, "peer shutdown")
            chk.check("engine reported stopped", lambda: wait_until(lambda: not hvd.is_initialized(), 30, "stop"))
        elif mode == "peer_shutdown":
            t0 = time.monotonic()
            hvd.shutdown()
            log(f"shutdown() returned after {time.monotonic() - t0:.2f} s")
            chk.check("not initialized after shutdown", lambda: _assert(not hvd.is_initialized()))
            ops_fail_after_stop(chk, "own shutdown")
        else:  # peer_exit: leave without shutdown(); atexit must stop the engine everywhere
            print(f"[rank {r}] exiting with the orphan pending on rank 0", flush=True)
            chk.finish()  # sys.exit
        chk.finish()

    if mode == "self_shutdown":
        orphan = hvd.allreduce_async(np.ones(4, F32), op=hvd.Sum, name="orphan.self") if r == 0 else None
        chk.check("op beside the orphan", lambda: sum_allreduce("beside", n, r))
        if r == 0:
            hvd.shutdown()

            def orphan_fails():
                err, _ = expect_error(orphan, hvd.ShutdownError, 30, "orphan.self")
                assert "orphan.self" in str(err), str(err)
            chk.check("own pending op fails with ShutdownError", orphan_fails)
            chk.check("not initialized after shutdown", lambda: _assert(not hvd.is_initialized()))
        else:
            chk.check("engine stops when a peer shuts down",
                      lambda: wait_until(lambda: not hvd.is_initialized(), 60, "stop after peer shutdown"))
            ops_fail_after_stop(chk, "peer shutdown")
        # shutdown() again is harmless.
        chk.check("second shutdown()", hvd.shutdown)
        chk.finish()

    if mode == "exit_clean":
        chk.check("one op", lambda: sum_allreduce("exit.clean", n, r))
        print(f"[rank {r}] exiting without shutdown()", flush=True)
        chk.finish()  # sys.exit: atexit runs shutdown()

    if mode == "exit_pending":
        if r == 0:
            hvd.allreduce_async(np.ones(4, F32), op=hvd.Sum, name="exit.pending")  # never synchronized
        # Completes on both ranks only after rank 0 queued the op above.
        chk.check("one op", lambda: sum_allreduce("exit.pending.beside", n, r))
        print(f"[rank {r}] exiting with {'an op' if r == 0 else 'nothing'} pending", flush=True)
        chk.finish()

    if mode == "reinit":
        chk.check("op before shutdown", lambda: sum_allreduce("reinit.before", n, r))
        hvd.shutdown()
        chk.check("not initialized", lambda: _assert(not hvd.is_initialized()))
        hvd.init()
        chk.check("initialized again", lambda: _assert(hvd.is_initialized() and hvd.size() == n))
        chk.check("op after init() again", lambda: sum_allreduce("reinit.after", n, r))
        chk.check("same name as before shutdown", lambda: sum_allreduce("reinit.before", n, r))
        hvd.shutdown()
        chk.finish()

    if mode in ("thread_blocked", "exit_daemon"):
        caught = []

        def blocked():
            try:
                hvd.allreduce(np.ones(4, F32), op=hvd.Sum, name="orphan.thread")
            except BaseException as e:  # noqa: BLE001 - reported to the main thread
                caught.append(e)

        thread = None
        if r == 0:
            thread = threading.Thread(target=blocked, daemon=True)
            thread.start()
            time.sleep(0.3)
        chk.check("op beside the blocked thread", lambda: sum_allreduce("beside.thread", n, r))
        if mode == "exit_daemon":
            print(f"[rank {r}] exiting with a daemon thread blocked in allreduce", flush=True)
            chk.finish()
        if r == 0:
            hvd.shutdown()
            thread.join(30)

            def thread_got_shutdown_error():
                assert not thread.is_alive(), "the blocked thread is still blocked 30 s after shutdown()"
                assert len(caught) == 1 and isinstance(caught[0], hvd.ShutdownError), caught
            chk.check("blocked thread gets ShutdownError", thread_got_shutdown_error)
        else:
            chk.check("engine stops", lambda: wait_until(lambda: not hvd.is_initialized(), 60, "stop"))
        chk.finish()

    raise SystemExit(f"unknown mode {mode}")


def _assert(cond):
    assert cond


if __name__ == "__main__":
    main()
