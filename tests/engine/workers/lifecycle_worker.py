"""Process lifecycle: exit with threads blocked, signals while blocked, fork after init().

  lifecycle_worker.py exit_blocked shutdown|return
        16 daemon threads block in synchronize() on names no other rank submits; the main
        thread calls shutdown() (or not) and returns. The process must exit with status 0 (it
        aborted with "terminate called without an active exception" when a woken thread asked
        for the GIL back while the interpreter finalized).
  lifecycle_worker.py signals
        a rank blocked in synchronize() runs Python's signal handlers promptly (SIGALRM that
        raises, SIGALRM that returns, SIGINT's KeyboardInterrupt, a grouped handle); the
        interrupted handle stays valid and a later synchronize() returns the right result.
        Every case runs twice, each rank being the waiter once.
  lifecycle_worker.py ctrl_c DIR
        every rank blocks forever in synchronize() and writes DIR/pid.<rank>; the test sends
        SIGINT to the launcher's process group. Each rank reports its KeyboardInterrupt in
        DIR/interrupted.<rank>.
  lifecycle_worker.py fork
        os.fork() after init(): the child keeps rank()/size(), every operation raises
        NotInitializedError naming the parent, and it exits normally with status 0 at once; the
        parent goes on with correct results.
  lifecycle_worker.py dataloader
        a torch DataLoader with num_workers=2 (multiprocessing's "fork" start method) in an
        initialized process.
"""
import os
import signal
import sys
import threading
import time

import numpy as np

import collectives as hvd
from collectives import handles
from common import Checker, rank_input
from robust_util import log

F32 = np.float32
# How long the late rank waits before submitting. The bounds on how soon a signal handler runs
# are a fraction of it (a handler that ran only when the wait ended would run after LATE_S), and
# generous: on a loaded CI machine a KeyboardInterrupt once arrived 1.24 s after its wait began
# (SIGINT at 0.3 s) against a bound of 0.55 s, with LATE_S 1.5.
# The late rank submits after the handler's bound (0.3 s + HANDLER_BOUND_S) with 0.7 s to spare.
LATE_S = 2.0
HANDLER_BOUND_S = 1.0  # after the signal


class Interrupted(Exception):
    """Raised by the test's SIGALRM handler."""


def exit_blocked(how):
    hvd.init()
    r = hvd.rank()

    def blocked(i):
        try:
            hvd.allreduce(np.ones(4, F32), name=f"exit.blocked.{r}.{i}")
        except BaseException:  # noqa: BLE001 - ShutdownError at exit; then keep the GIL busy
            total = 0
            for k in range(200000):
                total += k

    for i in range(16):
        threading.Thread(target=blocked, args=(i,), daemon=True).start()
    time.sleep(0.05)  # the threads are blocked in synchronize()
    print(f"[rank {r}] 1 passed, 0 failed", flush=True)
    if how == "shutdown":
        hvd.shutdown()


def sync_point(label):
    hvd.allreduce(np.zeros(1, F32), op=hvd.Sum, name=f"sync.{label}")


def expected_sum(seed, n, shape=(5,)):
    return sum(rank_input(seed, k, shape, F32) for k in range(n))


def signal_case(chk, label, seed, waiter, body):
    """Rank ``waiter`` runs ``body(handle)`` on an allreduce the other ranks submit LATE_S
    later; the others submit late and check their result."""
    r, n = hvd.rank(), hvd.size()
    sync_point(f"{label}.{waiter}")
    x = rank_input(seed, r, (5,), F32)
    name = f"{label}.{waiter}"
    if r == waiter:
        def run():
            handle = hvd.allreduce_async(x, op=hvd.Sum, name=name)
            body(handle, lambda out: np.testing.assert_array_equal(out, expected_sum(seed, n)))
        chk.check(f"{label} (waiter)", run)
    else:
        time.sleep(LATE_S)

        def late():
            np.testing.assert_array_equal(hvd.allreduce(x, op=hvd.Sum, name=name), expected_sum(seed, n))
        chk.check(f"{label} (late rank)", late)


def raising_alarm_around(wait):
    """Runs ``wait()`` with a SIGALRM handler that raises after 0.3 s: ``wait`` must be
    interrupted (not return), and the handler must run within HANDLER_BOUND_S of the signal."""
    fired = []

    def on_alarm(signum, frame):
        fired.append(time.monotonic())
        raise Interrupted()

    old = signal.signal(signal.SIGALRM, on_alarm)
    try:
        due = time.monotonic() + 0.3
        signal.setitimer(signal.ITIMER_REAL, 0.3)
        try:
            wait()
            raise AssertionError("the wait returned before the late rank submitted")
        except Interrupted:
            pass
        latency = fired[0] - due
        log(f"SIGALRM handler ran {latency * 1000:.0f} ms after the signal")
        assert latency < HANDLER_BOUND_S, f"the handler ran {latency * 1000:.0f} ms after the signal"
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


def raising_alarm(handle, check):
    raising_alarm_around(lambda: hvd.synchronize(handle))
    assert not hvd.poll(handle), "the handle completed although the late rank has not submitted"
    check(hvd.synchronize(handle))  # the interrupted handle is still valid
    check(hvd.synchronize(handle))  # and keeps its result


def returning_alarm(handle, check):
    calls = []
    old = signal.signal(signal.SIGALRM, lambda signum, frame: calls.append(time.monotonic()))
    try:
        signal.setitimer(signal.ITIMER_REAL, 0.1, 0.1)
        check(hvd.synchronize(handle))
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)
    log(f"a returning SIGALRM handler ran {len(calls)} times during the wait")
    assert len(calls) >= 5, f"the handler ran only {len(calls)} times in about {LATE_S} s"


def keyboard_interrupt(handle, check):
    timer = threading.Timer(0.3, os.kill, (os.getpid(), signal.SIGINT))
    start = time.monotonic()
    timer.start()
    try:
        hvd.synchronize(handle)
        raise AssertionError("synchronize returned before the late rank submitted")
    except KeyboardInterrupt:
        elapsed = time.monotonic() - start
    finally:
        timer.join()
    log(f"KeyboardInterrupt after {elapsed:.2f} s (SIGINT at 0.30 s)")
    assert elapsed < 0.3 + HANDLER_BOUND_S, f"KeyboardInterrupt only after {elapsed:.2f} s (late rank at {LATE_S} s)"
    check(hvd.synchronize(handle))


def signals():
    hvd.init()
    r, n = hvd.rank(), hvd.size()
    chk = Checker(r)
    cases = [("sig.raise", raising_alarm), ("sig.return", returning_alarm), ("sig.int", keyboard_interrupt)]
    for seed, (label, body) in enumerate(cases):
        for waiter in range(n):
            signal_case(chk, label, seed, waiter, body)

    # A synchronous verb (one engine call, csrc/python/allreduce_now.cc) interrupted by a raising handler:
    # the exception arrives promptly, the allreduce still completes for the late rank, and the
    # waiter's arrays stay alive until it does (the engine writes its output). Rank 0 waits here
    # and the last rank in the grouped case below: each late rank costs LATE_S of the run.
    for waiter in (0,):
        sync_point(f"verb.{waiter}")
        x = rank_input(20, r, (5,), F32)
        name = f"verb.{waiter}"
        if r == waiter:
            def interrupted_verb():
                raising_alarm_around(lambda: hvd.allreduce(x, op=hvd.Sum, name=name))
                kept = [h for h in handles._outstanding.values() if not h.poll()]
                assert len(kept) == 1, f"{len(kept)} interrupted operations kept, expected 1"
                np.testing.assert_array_equal(hvd.synchronize(kept[0]), expected_sum(20, n))
            chk.check("synchronous verb interrupted", interrupted_verb)
        else:
            time.sleep(LATE_S)
            chk.check("synchronous verb (late rank)",
                      lambda: np.testing.assert_array_equal(hvd.allreduce(x, op=hvd.Sum, name=name),
                                                            expected_sum(20, n)))

    # A grouped handle (several engine ids): interrupted, then resumed.
    for waiter in (n - 1,):
        sync_point(f"group.{waiter}")
        xs = [rank_input(10 + k, r, (3,), F32) for k in range(3)]
        expected = [sum(rank_input(10 + k, q, (3,), F32) for q in range(n)) for k in range(3)]

        def check(outs):
            for out, exp in zip(outs, expected):
                np.testing.assert_array_equal(out, exp)

        if r == waiter:
            chk.check("grouped handle interrupted and resumed",
                      lambda: raising_alarm(hvd.grouped_allreduce_async(xs, op=hvd.Sum, name=f"group.{waiter}"),
                                            check))
        else:
            time.sleep(LATE_S)
            chk.check("grouped (late rank)",
                      lambda: check(hvd.grouped_allreduce(xs, op=hvd.Sum, name=f"group.{waiter}")))
    hvd.shutdown()
    chk.finish()


def ctrl_c(directory):
    hvd.init()
    r = hvd.rank()
    with open(os.path.join(directory, f"pid.{r}"), "w") as f:
        f.write(str(os.getpid()))
    start = time.monotonic()
    try:
        hvd.allreduce(np.ones(2, F32), name=f"ctrl_c.never.{r}")  # no other rank submits it
    except KeyboardInterrupt:
        with open(os.path.join(directory, f"interrupted.{r}"), "w") as f:
            f.write(f"{time.monotonic() - start:.3f}")
        raise


def child_checks(parent_pid, rank, pending):
    """In the forked child: returns a list of failures (empty: all good)."""
    failures = []

    def expect_refusal(label, fn):
        try:
            fn()
        except hvd.NotInitializedError as e:
            if f"parent process (pid {parent_pid})" not in str(e):
                failures.append(f"{label}: message does not name the parent: {e}")
        except BaseException as e:  # noqa: BLE001 - reported to the parent
            failures.append(f"{label}: {type(e).__name__}: {e}")
        else:
            failures.append(f"{label}: no error")

    if hvd.rank() != rank:
        failures.append(f"rank() is {hvd.rank()} in the child, {rank} in the parent")
    expect_refusal("allreduce", lambda: hvd.allreduce(np.ones(2, F32), name="fork.child"))
    expect_refusal("allreduce_async", lambda: hvd.allreduce_async(np.ones(2, F32), name="fork.child.async"))
    expect_refusal("synchronize of the parent's handle", lambda: hvd.synchronize(pending))
    expect_refusal("init()", hvd.init)
    hvd.shutdown()  # harmless: the engine is the parent's
    return failures


def fork_case(chk, round_):
    r, n = hvd.rank(), hvd.size()
    seed = 100 + round_
    pending = hvd.allreduce_async(rank_input(seed, r, (6,), F32), op=hvd.Sum, name=f"fork.pending.{round_}")
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: report through the pipe, then exit normally (atexit, finalization)
        os.close(read_end)
        failures = child_checks(os.getppid(), r, pending)
        os.write(write_end, ("\n".join(failures) or "ok").encode())
        os.close(write_end)
        sys.exit(0)
    os.close(write_end)
    deadline = time.monotonic() + 20
    status = None
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            break
        time.sleep(0.02)
    else:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
    with os.fdopen(read_end) as f:
        report = f.read()

    def child_exited_cleanly():
        assert status is not None and os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0, \
            f"child did not exit with status 0 within 20 s (status {status}); it reported: {report!r}"
    chk.check(f"forked child exits with status 0 (round {round_})", child_exited_cleanly)

    def child_refused():
        assert report == "ok", report
    chk.check(f"every operation in the child raises NotInitializedError (round {round_})", child_refused)

    def parent_goes_on():
        np.testing.assert_array_equal(hvd.synchronize(pending), expected_sum(seed, n, (6,)))
        x = rank_input(seed + 50, r, (4, 3), np.float64)
        np.testing.assert_array_equal(hvd.allreduce(x, op=hvd.Sum, name=f"fork.after.{round_}"),
                                      sum(rank_input(seed + 50, q, (4, 3), np.float64) for q in range(n)))
    chk.check(f"parent's operations after the fork (round {round_})", parent_goes_on)


def fork():
    hvd.init()
    chk = Checker(hvd.rank())
    for round_ in range(3):
        fork_case(chk, round_)
    hvd.shutdown()
    chk.finish()


def dataloader():
    import torch
    from torch.utils.data import DataLoader, Dataset

    hvd.init()
    r, n = hvd.rank(), hvd.size()
    chk = Checker(r)

    class Items(Dataset):
        def __len__(self):
            return 12

        def __getitem__(self, i):
            # In a forked worker: topology works, operations are refused.
            try:
                hvd.allreduce(np.ones(1, F32), name=f"worker.{i}")
                refusal = "no error"
            except hvd.NotInitializedError as e:
                refusal = "ok" if "parent process" in str(e) else str(e)
            return torch.full((3,), float(i + r)), hvd.rank(), refusal, os.getpid()

    def epochs():
        for epoch in range(2):
            loader = DataLoader(Items(), batch_size=4, num_workers=2, multiprocessing_context="fork")
            worker_pids = set()
            for b, (batch, ranks, refusals, pids) in enumerate(loader):
                assert set(ranks.tolist()) == {r}, ranks
                assert set(refusals) == {"ok"}, refusals
                worker_pids.update(pids.tolist())
                out = hvd.allreduce(batch.numpy(), op=hvd.Sum, name=f"dl.{epoch}.{b}")
                expected = sum(np.stack([np.full(3, float(i + q), F32) for i in range(4 * b, 4 * b + 4)])
                               for q in range(n))
                np.testing.assert_array_equal(out, expected)
            assert os.getpid() not in worker_pids and len(worker_pids) == 2, worker_pids
    chk.check("DataLoader with 2 forked workers, two epochs", epochs)
    hvd.shutdown()
    chk.finish()


def main():
    mode = sys.argv[1]
    if mode == "exit_blocked":
        exit_blocked(sys.argv[2])
    elif mode == "signals":
        signals()
    elif mode == "ctrl_c":
        ctrl_c(sys.argv[2])
    elif mode == "fork":
        fork()
    elif mode == "dataloader":
        dataloader()
    else:
        raise SystemExit(f"unknown mode {mode}")


if __name__ == "__main__":
    main()
