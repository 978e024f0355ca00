"""How often a rank's threads wake while it waits for a late peer, or for nothing.

Between cycles the engine's threads sleep on a doorbell (csrc/shm/doorbell.h) that the rank's own
submissions and the peers on this host ring. Rank LATE submits its allreduce WAIT_S late; the
others submit theirs at once and then sleep in Python (the engine thread, not a caller, waits).
Every rank checks that its engine thread carries its name, counts the voluntary context
switches (wake-ups after a sleep) of its threads other than the main one during that window, and
again during an idle window with nothing in flight, and prints "wakeups CASE RANK COUNT"; the
results are checked against numpy.
"""
import os
import sys
import threading
import time

import numpy as np

import collectives as hvd
from common import Checker, rank_input

WAIT_S = 1.0

hvd.init()
RANK, SIZE = hvd.rank(), hvd.size()
checker = Checker(RANK)
MAIN = threading.get_native_id()


def wakeups():
    """Voluntary context switches of this process's threads but the main one, summed."""
    total = 0
    for tid in os.listdir("/proc/self/task"):
        if int(tid) == MAIN:
            continue
        try:
            with open(f"/proc/self/task/{tid}/status") as f:
                for line in f:
                    if line.startswith("voluntary_ctxt_switches:"):
                        total += int(line.split()[1])
        except FileNotFoundError:  # a thread that ended
            pass
    return total


def late_peer(case, late):
    x = rank_input(case, RANK, (64,), np.float32)
    expected = sum(rank_input(case, r, (64,), np.float32) for r in range(SIZE))
    hvd.allreduce(np.zeros(1, np.float32), name=f"start.{case}")  # every rank here together
    before = wakeups()
    if RANK == late:
        time.sleep(WAIT_S)
        handle = hvd.allreduce_async(x, op=hvd.Sum, name=f"late.{case}")
    else:
        handle = hvd.allreduce_async(x, op=hvd.Sum, name=f"late.{case}")
        time.sleep(WAIT_S)
    woke = wakeups() - before
    checker.check(f"late peer {late}: result", lambda: np.testing.assert_array_equal(hvd.synchronize(handle), expected))
    print(f"wakeups late{late} {RANK} {woke}", flush=True)


def idle(case):
    hvd.allreduce(np.zeros(1, np.float32), name=f"start.{case}")
    before = wakeups()
    time.sleep(WAIT_S)
    woke = wakeups() - before
    checker.check("idle: an allreduce after", lambda: np.testing.assert_array_equal(
        hvd.allreduce(np.full(3, RANK, np.int32), op=hvd.Sum, name=f"after.{case}"),
        np.full(3, sum(range(SIZE)), np.int32)))
    print(f"wakeups idle {RANK} {woke}", flush=True)


def thread_names():
    names = []
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/comm") as f:
                names.append((int(tid), f.read().strip()))
        except FileNotFoundError:  # a thread that ended
            pass
    return names


def engine_thread_named():
    """The engine's thread is named (csrc/common/thread_name.h), so that top -H and debuggers tell it from
    the framework's threads; the caller's thread keeps its own name."""
    names = thread_names()
    assert [n for _, n in names].count("coll-engine") >= 1, names
    assert dict(names)[MAIN] != "coll-engine", names


checker.check("the engine thread is named coll-engine", engine_thread_named)
for late in range(SIZE):
    late_peer(100 + late, late)
idle(200)
hvd.shutdown()
checker.finish()
