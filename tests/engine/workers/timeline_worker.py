"""Timeline producer.

  timeline_worker.py env              run with COLLECTIVES_TIMELINE (or HOROVOD_TIMELINE) set:
                                      the workload, then shutdown() closes the file
  timeline_worker.py env_exit         the same, but the process exits without shutdown()
  timeline_worker.py midflight PATH   start_timeline() while an allreduce is in flight (rank 1
                                      submits it late), stop_timeline() once all is done
  timeline_worker.py torch            run with COLLECTIVES_TIMELINE set: collectives.torch's verbs,
                                      named ("tt.*") and unnamed, whose requests carry
                                      Horovod's torch names (issue 35 item 5)
  timeline_worker.py tensorflow       the same for collectives.tensorflow: unnamed calls in a
                                      tf.function carry Horovod's graph names
  timeline_worker.py api PATH PATH2   start_timeline(PATH, mark_cycles=True), the workload,
                                      stop_timeline(), ops that must not be recorded, then
                                      start_timeline(PATH2) for one more op, and shutdown()

The workload: rounds of several allreduce_async submitted together then synchronized (they
fuse), a grouped allreduce (fused for certain), a broadcast and an allgather.
"""
import sys
import time

import numpy as np

import collectives as hvd
from common import Checker
from robust_util import wait

FUSED = [f"tl.fused.{i}" for i in range(6)]
GROUP = "tl.group"


def torch_workload(r, n):
    """One of each torch verb, named, and an unnamed allreduce; the results are checked so that
    the names are those of completed requests."""
    import torch

    import collectives.torch as ht

    x = torch.full((2 * n,), float(r + 1))
    total = float(n * (n + 1) // 2)
    torch.testing.assert_close(ht.allreduce(x, op=ht.Sum, name="tt.allreduce"), torch.full((2 * n,), total))
    torch.testing.assert_close(ht.allreduce(x, op=ht.Sum), torch.full((2 * n,), total))
    grouped = ht.grouped_allreduce([x, x + 1], op=ht.Sum, name="tt.group")
    torch.testing.assert_close(grouped[1], torch.full((2 * n,), total + n))
    assert ht.allgather(x[:1], name="tt.allgather").tolist() == [float(i + 1) for i in range(n)]
    assert ht.broadcast(x, 0, name="tt.broadcast").tolist() == [1.0] * (2 * n)
    received, _ = ht.alltoall(x, torch.full((n,), 2, dtype=torch.int32), name="tt.alltoall")
    assert received.tolist() == [float(i + 1) for i in range(n) for _ in range(2)]
    torch.testing.assert_close(ht.reducescatter(x, op=ht.Sum, name="tt.reducescatter"), torch.full((2,), total))


def tensorflow_workload(r, n):
    """Unnamed verbs traced into a tf.function (run twice: the same names each step), a named one,
    and an unnamed eager one."""
    import tensorflow as tf

    import collectives.tensorflow as htf

    @tf.function
    def step(x):
        total = htf.allreduce(x, op=htf.Sum)
        again = htf.allreduce(x, op=htf.Sum)  # a second op on the same input: made unique
        gathered = htf.allgather(x)
        grouped = htf.grouped_allreduce([x, x * 2], op=htf.Sum)
        named = htf.allreduce(x, op=htf.Sum, name="tt.tf.named")
        return total, again, gathered, grouped[1], named

    x = tf.fill([2], float(r + 1))
    total = float(n * (n + 1) // 2)
    for _ in range(2):
        a, b, g, g2, c = step(x)
        assert a.numpy().tolist() == b.numpy().tolist() == c.numpy().tolist() == [total, total]
        assert g.numpy().tolist() == [float(i + 1) for i in range(n) for _ in range(2)]
        assert g2.numpy().tolist() == [2 * total] * 2
    assert htf.allreduce(x, op=htf.Sum).numpy().tolist() == [total, total]


def workload(r, n):
    f32 = np.float32
    for round_ in range(8):
        handles = [hvd.allreduce_async(np.full(16 + i, r + round_, f32), op=hvd.Sum, name=name)
                   for i, name in enumerate(FUSED)]
        for i, h in enumerate(handles):
            out = wait(h, 60, FUSED[i])
            np.testing.assert_array_equal(out, np.full(16 + i, n * round_ + n * (n - 1) / 2, f32))
    outs = wait(hvd.grouped_allreduce_async([np.full(8, r, f32) for _ in range(4)], op=hvd.Sum, name=GROUP), 60, GROUP)
    for out in outs:
        np.testing.assert_array_equal(out, np.full(8, n * (n - 1) / 2, f32))
    out = wait(hvd.broadcast_async(np.full(5, r, f32), 0, name="tl.bcast"), 60, "tl.bcast")
    np.testing.assert_array_equal(out, np.zeros(5, f32))
    out = wait(hvd.allgather_async(np.full((2, 2), r, f32), name="tl.gather"), 60, "tl.gather")
    assert out.shape == (2 * n, 2)


def main():
    mode = sys.argv[1]
    hvd.init()
    r, n = hvd.rank(), hvd.size()
    chk = Checker(r)
    if mode == "api":
        path, path2 = sys.argv[2], sys.argv[3]
        hvd.start_timeline(path, mark_cycles=True)
        chk.check("workload", lambda: workload(r, n))
        hvd.stop_timeline()
        # Not recorded: the timeline is stopped.
        chk.check("op after stop", lambda: wait(hvd.allreduce_async(np.ones(3, np.float32), name="tl.after.stop"),
                                                60, "tl.after.stop"))
        def unwritable():
            try:
                hvd.start_timeline("/nonexistent-dir/timeline.json")
            except hvd.InvalidArgumentError as e:
                assert "/nonexistent-dir/timeline.json" in str(e), str(e)
            else:
                # Only rank 0 writes the timeline; the others ignore the call.
                assert r != 0, "start_timeline on an unwritable path did not raise on rank 0"
        chk.check("unwritable timeline path", unwritable)
        hvd.start_timeline(path2, mark_cycles=False)
        chk.check("op in the second timeline",
                  lambda: wait(hvd.allreduce_async(np.ones(3, np.float32), name="tl.second"), 60, "tl.second"))
    elif mode == "torch":
        chk.check("torch verbs", lambda: torch_workload(r, n))
    elif mode == "tensorflow":
        chk.check("tensorflow verbs", lambda: tensorflow_workload(r, n))
    elif mode == "midflight":
        def midflight():
            handle = None
            if r == 0:
                handle = hvd.allreduce_async(np.ones(4, np.float32), op=hvd.Sum, name="tl.inflight")
                time.sleep(0.3)  # negotiating: rank 1 has not submitted yet
                hvd.start_timeline(sys.argv[2], mark_cycles=True)
            else:
                time.sleep(0.6)
                hvd.start_timeline(sys.argv[2], mark_cycles=True)  # ignored off rank 0
                handle = hvd.allreduce_async(np.ones(4, np.float32), op=hvd.Sum, name="tl.inflight")
            np.testing.assert_array_equal(wait(handle, 60, "tl.inflight"), np.full(4, n, np.float32))
            out = wait(hvd.allreduce_async(np.ones(4, np.float32), op=hvd.Sum, name="tl.after"), 60, "tl.after")
            np.testing.assert_array_equal(out, np.full(4, n, np.float32))
            hvd.stop_timeline()
        chk.check("start_timeline with an op in flight", midflight)
    else:
        chk.check("workload", lambda: workload(r, n))
    if mode == "env_exit":
        chk.finish()  # sys.exit without shutdown(): atexit must still close the timeline
    hvd.shutdown()
    chk.finish()


if __name__ == "__main__":
    sys.exit(main())
