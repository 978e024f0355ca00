"""A child forked after init() that ends through Python's normal exit (atexit handlers,
interpreter finalization, C exit handlers), not os._exit: it must be gone at once, and the
parent's engine must go on (tests/engine/test_fork_exit.py).

  fork_exit_worker.py

Cases, on every rank:
  * the child calls sys.exit(0) while another thread of the parent was on its way back to the
    GIL from a wait. The child used to hang at exit for ever: the engine's atexit gate
    (csrc/python/python_gil.h) waited for that thread, which a forked child does not have.
  * the child ends through an uncaught exception: exit status 1 at once.
After each: an allreduce in the parent against a numpy reference.
"""
import os
import signal
import sys
import threading
import time

import numpy as np

import collectives as hvd
from common import Checker, rank_input

F32 = np.float32
CHILD_LIMIT_S = 10  # a child still alive after this is reported hung (and killed)
# How long the parent keeps the GIL after the pending operation completed, so that the thread
# blocked in its wait has surely woken and queued for the GIL before the fork. Not a bound
# anything is checked against: a longer wake-up only makes the old hang rarer.
QUEUE_FOR_GIL_S = 0.3


def wait_for_child(pid):
    """The child's wait status, or None when it had not exited within CHILD_LIMIT_S (then it
    is killed)."""
    deadline = time.monotonic() + CHILD_LIMIT_S
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return status
        time.sleep(0.02)
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    return None


def describe(status):
    if status is None:
        return f"still running after {CHILD_LIMIT_S} s (killed)"
    if os.WIFEXITED(status):
        return f"exit status {os.WEXITSTATUS(status)}"
    return f"killed by signal {os.WTERMSIG(status)}"


def fork_and_wait(child_body):
    """Forks; the child runs ``child_body()`` and then ends through sys.exit(0) (or whatever
    child_body raises). Returns the child's wait status in the parent."""
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:
        child_body()
        sys.exit(0)
    return wait_for_child(pid)


def parent_allreduce(seed):
    r, n = hvd.rank(), hvd.size()
    out = hvd.allreduce(rank_input(seed, r, (5,), F32), op=hvd.Sum, name=f"fork_exit.after.{seed}")
    np.testing.assert_array_equal(out, sum(rank_input(seed, q, (5,), F32) for q in range(n)))


def exit_while_a_thread_returns_to_the_gil(chk):
    r = hvd.rank()
    # The other rank submits its part only after this one's waiting thread is blocked, so the
    # operation completes while this rank's main thread holds the GIL.
    x = rank_input(7, r, (3,), F32)
    if r == 0:
        handle = hvd.allreduce_async(x, op=hvd.Sum, name="fork_exit.returning")
        results = []
        waiter = threading.Thread(target=lambda: results.append(hvd.synchronize(handle)))
        waiter.start()
        time.sleep(0.2)  # the waiter runs and blocks in the engine's wait without the GIL
    hvd.barrier()
    if r != 0:
        hvd.allreduce(x, op=hvd.Sum, name="fork_exit.returning")
        status = fork_and_wait(lambda: None)
    else:
        interval = sys.getswitchinterval()
        sys.setswitchinterval(60)  # keep the GIL: the woken waiter queues for it
        try:
            while not hvd.poll(handle):
                pass
            until = time.monotonic() + QUEUE_FOR_GIL_S
            while time.monotonic() < until:
                pass
            status = fork_and_wait(lambda: None)
        finally:
            sys.setswitchinterval(interval)
        waiter.join()

        def waiter_got_the_sum():
            np.testing.assert_array_equal(results[0], sum(rank_input(7, q, (3,), F32) for q in range(hvd.size())))
        chk.check("the waiting thread's result", waiter_got_the_sum)

    def child_exited_at_once():
        assert status is not None and os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0, \
            f"the child that called sys.exit(0) is {describe(status)}"
    chk.check("a child's sys.exit(0) while a thread returns to the GIL", child_exited_at_once)
    chk.check("the parent's allreduce after that child", lambda: parent_allreduce(11))


def exit_through_an_exception(chk):
    def fail():
        raise RuntimeError("the forked child's uncaught error (expected by the test)")
    status = fork_and_wait(fail)

    def child_exited_with_1():
        assert status is not None and os.WIFEXITED(status) and os.WEXITSTATUS(status) == 1, \
            f"the child that raised is {describe(status)}"
    chk.check("a child ending through an uncaught exception", child_exited_with_1)
    chk.check("the parent's allreduce after that child", lambda: parent_allreduce(12))


def main():
    hvd.init()
    chk = Checker(hvd.rank())
    exit_while_a_thread_returns_to_the_gil(chk)
    exit_through_an_exception(chk)
    hvd.shutdown()
    chk.finish()


if __name__ == "__main__":
    main()
