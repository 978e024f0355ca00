"""stop_timeline() returns only once the file is complete JSON, also when something else touches
the timeline meanwhile (tests/engine/test_timeline_races.py).

  timeline_race_worker.py OUT_DIR

Cases (rank 0 writes the timeline and reads it; the other ranks check that they wrote nothing):
  * a child forked while the timeline runs ends through sys.exit(0). Its exit used to flush the
    stdio buffer it had inherited, writing the parent's pending events into the file a second
    time: the JSON broke (csrc/monitor/timeline.cc).
  * two threads call stop_timeline() at once, CYCLES times, each reading the file as soon as its
    call returns. The second call used to return at once while the first was still finishing
    the file: the reader found it without its closing bracket.
"""
import json
import os
import sys
import threading

import numpy as np

import collectives as hvd
from common import Checker, rank_input

F32 = np.float32
CYCLES = 30


def timeline_events(path):
    """The timeline's events; an AssertionError naming the JSON error and the file's end."""
    with open(path) as f:
        text = f.read()
    try:
        events = json.loads(text)
    except json.JSONDecodeError as e:
        raise AssertionError(f"{path} is not valid JSON ({e}); it ends with:\n{text[-300:]}") from None
    assert isinstance(events, list) and all(isinstance(e, dict) and "ph" in e for e in events), text[-300:]
    return events


def tensor_names(events):
    return {e["args"]["name"] for e in events if e["ph"] == "M" and e.get("name") == "process_name"}


def allreduce_checked(seed, name):
    r, n = hvd.rank(), hvd.size()
    out = hvd.allreduce(rank_input(seed, r, (6,), F32), op=hvd.Sum, name=name)
    np.testing.assert_array_equal(out, sum(rank_input(seed, q, (6,), F32) for q in range(n)))


def check_written_by_rank_0_only(path, names):
    if hvd.rank() == 0:
        missing = set(names) - tensor_names(timeline_events(path))
        assert not missing, f"the timeline names no {sorted(missing)}"
    else:
        assert not os.path.exists(path), f"rank {hvd.rank()} wrote a timeline"


def forked_child_exits_while_recording(out_dir):
    path = os.path.join(out_dir, f"fork.{hvd.rank()}.json")
    hvd.start_timeline(path)
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:
        sys.exit(0)  # atexit, finalization, then C exit(), which flushes every stdio stream
    _, status = os.waitpid(pid, 0)
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0, f"child wait status {status}"
    allreduce_checked(21, "timeline_race.fork")
    hvd.stop_timeline()
    check_written_by_rank_0_only(path, ["timeline_race.fork"])


def concurrent_stops(out_dir):
    r = hvd.rank()
    unfinished = []
    for cycle in range(CYCLES):
        path = os.path.join(out_dir, f"stops.{r}.{cycle}.json")
        hvd.start_timeline(path)
        handles = [hvd.allreduce_async(np.ones(8, F32), op=hvd.Sum, name=f"timeline_race.stops.{k}")
                   for k in range(20)]
        for h in handles:
            np.testing.assert_array_equal(hvd.synchronize(h), np.full(8, hvd.size(), F32))
        together = threading.Barrier(2)

        def stop_and_read():
            together.wait()
            hvd.stop_timeline()
            try:
                check_written_by_rank_0_only(path, [f"timeline_race.stops.{k}" for k in range(20)])
            except AssertionError as e:
                unfinished.append(f"cycle {cycle}: {e}")
        threads = [threading.Thread(target=stop_and_read) for _ in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert not unfinished, f"{len(unfinished)} of {2 * CYCLES} reads after stop_timeline() failed; first: " \
                           f"{unfinished[0]}"


def main():
    out_dir = sys.argv[1]
    hvd.init()
    chk = Checker(hvd.rank())
    chk.check("a forked child's normal exit leaves the timeline valid",
              lambda: forked_child_exits_while_recording(out_dir))
    chk.check("two threads' stop_timeline() at once: both return a complete file",
              lambda: concurrent_stops(out_dir))
    chk.check("allreduce after the timeline cases", lambda: allreduce_checked(22, "timeline_race.after"))
    hvd.shutdown()
    chk.finish()


if __name__ == "__main__":
    main()
