"""GPU work that arrives while the GPU is busy waits and fuses (run under mpirun, with the
stand-in libraries of tests/gpu/fakes; tests/gpu/test_gpu_loader.py).

Usage: gpu_fake_fusion_worker.py busy              (np=1)
       gpu_fake_fusion_worker.py busy_two_ranks    (np=2, FAKE_NCCL_ANY_RANKS=1)

The test sets COLLECTIVES_GPU_FUSION_WAIT_MS (the longest wait) long, or 0, and FAKE_CUDA_EVENT_US makes
each collective "run" on the GPU for that long, so that the counts below do not depend on how
fast this machine submits.
"""
import os
import time

import numpy as np

import collectives as hvd
from gpu_fake_runtime_worker import env, fakes
from gpu_fake_worker import FakeGpuArray, read, run_families

WAIT = (os.environ.get("COLLECTIVES_GPU_FUSION_WAIT", "1") != "0"
        and float(os.environ.get("COLLECTIVES_GPU_FUSION_WAIT_MS", "1")) > 0)


def engine_launches():
    """The engine's own count of its ncclAllReduce calls (Engine.gpu_allreduce_launches)."""
    from collectives import basics

    return basics.engine().gpu_allreduce_launches


def burst(arrays):
    _, nccl, _ = fakes()
    # The first goes at once (the GPU is idle); the other 39 arrive while it runs (within
    # the 100 ms wait) and go together. Before the wait, each was an NCCL call of its own
    # (161 of 161 ResNet-50 gradients).
    with env(FAKE_CUDA_EVENT_US="200000"):
        xs = arrays(40)
        # One rank: the sum is the input. Two (FAKE_NCCL_ANY_RANKS): each rank's stand-in
        # collective acts on its own data alone, so the input again; the calls are the point.
        want = [x.host.copy() for x in xs]
        before, counted_before = nccl("allreduce"), engine_launches()
        handles = []
        for i, x in enumerate(xs):
            handles.append(hvd.allreduce_async_(x, op=hvd.Sum, name=f"busy.{i}"))
            # 2 ms apart, as a backward pass hands them over: without the wait, each finds
            # the engine ready to negotiate it alone; with it, all arrive within the wait.
            time.sleep(0.002)
        for h in handles:
            hvd.synchronize(h)
        calls = nccl("allreduce") - before
        counted = engine_launches() - counted_before
    assert counted == calls, f"the engine counted {counted} ncclAllReduce calls, the library saw {calls}"
    # Every rank launches the same NCCL calls (on a GPU, one rank's extra call would wait forever).
    every = hvd.allgather(np.array([calls], np.int64), name="busy.calls")
    assert len(set(every.tolist())) == 1, f"the ranks made different numbers of NCCL calls: {every.tolist()}"
    for x, w in zip(xs, want):
        np.testing.assert_array_equal(x.host, w)
    print(f"[rank {hvd.rank()}] 40 allreduces: {calls} NCCL calls", flush=True)
    # Two ranks submit out of step: a cycle one rank starts may find names the other has not
    # submitted yet, which then need a cycle of their own.
    few = 4 if hvd.size() == 1 else 8
    if WAIT:
        assert calls <= few, f"40 allreduces submitted while the GPU was busy took {calls} NCCL calls"
    else:  # COLLECTIVES_GPU_FUSION_WAIT=0 or COLLECTIVES_GPU_FUSION_WAIT_MS=0: negotiated as they come
        assert calls > few, f"40 allreduces took only {calls} NCCL calls without the wait"


def random_arrays(seed):
    """arrays(count): that many stand-in GPU arrays of 1-299 float32 integers, from ``seed``."""
    rng = np.random.default_rng(seed)

    def arrays(count):
        return [FakeGpuArray(rng.integers(-50, 50, size=int(n)).astype(np.float32))
                for n in rng.integers(1, 300, size=count)]
    return arrays


def family_busy(chk):
    _, nccl, _ = fakes()
    arrays = random_arrays(11)

    chk.check("a burst submitted while the GPU is busy fuses into few NCCL calls", lambda: burst(arrays))

    def lone_calls():
        # Nothing runs on the GPU when each is submitted: each goes at once, on its own.
        xs = arrays(10)
        before = nccl("allreduce")
        for i, x in enumerate(xs):
            want = x.host * 2
            np.testing.assert_array_equal(read(hvd.allreduce(x, op=hvd.Sum, prescale_factor=2.0, name=f"lone.{i}")), want)
        assert nccl("allreduce") - before == 10, nccl("allreduce") - before
    chk.check("synchronous calls on an idle GPU each run at once", lone_calls)

    def other_verbs_while_busy():
        # Held with the allreduces, then run in the negotiated order: every result is right.
        with env(FAKE_CUDA_EVENT_US="200000"):
            xs = arrays(12)
            want = [x.host.copy() for x in xs]
            handles = []
            for i, x in enumerate(xs):
                if i % 3 == 0:
                    handles.append(("allgather", x, hvd.allgather_async(x, name=f"mixed.{i}")))
                elif i % 3 == 1:
                    handles.append(("broadcast", x, hvd.broadcast_async_(x, root_rank=0, name=f"mixed.{i}")))
                else:
                    handles.append(("allreduce", x, hvd.allreduce_async_(x, op=hvd.Sum, name=f"mixed.{i}")))
            for (verb, x, h), w in zip(handles, want):
                out = hvd.synchronize(h)
                np.testing.assert_array_equal(read(out) if verb == "allgather" else x.host, w)
    chk.check("allgather and broadcast held with allreduces give the same results", other_verbs_while_busy)

    def host_work_is_not_held():
        with env(FAKE_CUDA_EVENT_US="200000"):
            handle = hvd.allreduce_async_(arrays(1)[0], op=hvd.Sum, name="held.gpu")
            host = np.arange(5.0)
            np.testing.assert_array_equal(hvd.allreduce(host, op=hvd.Sum, name="held.host"), host)
            hvd.synchronize(handle)
    chk.check("host work goes while the GPU is busy", host_work_is_not_held)


def family_busy_two_ranks(chk):
    """The burst on two ranks (FAKE_NCCL_ANY_RANKS=1): each holds its own work, a peer's cycle
    takes the other's along, and both make the same few NCCL calls."""
    arrays = random_arrays(12)
    chk.check("a burst on two ranks fuses alike on both", lambda: burst(arrays))


if __name__ == "__main__":
    run_families(globals())
