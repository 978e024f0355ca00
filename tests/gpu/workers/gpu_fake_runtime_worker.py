"""The engine's GPU runtime rules, through the stand-in CUDA and NCCL libraries (tests/gpu/fakes)
on machines without a GPU (run under mpirun; tests/gpu/test_gpu_loader.py launches it).

Usage: gpu_fake_runtime_worker.py FAMILY

Families:
  agreement   np=2, FAKE_NCCL_ANY_RANKS=1: a member that cannot prepare its part (no memory
              for the fusion buffer or an output, no PreMulSum operator) makes the GPU
              collective fail on every member, and no member launches it; the communicator
              stays usable.
  timeout     np=1, a GPU wait that never ends: after the stall shutdown time the handle
              fails with StallTimeoutError and the communicator is aborted.
  release     np=2: removing a process set destroys its NCCL communicator (not at shutdown).
  inprogress  np=1, NCCL posing as non-blocking (ncclInProgress from every call): the engine
              waits the operations out instead of failing them.
  unlocked    np=1: ncclGroupEnd may block (lazy connection); the completion thread keeps
              polling meanwhile, i.e. no lock it needs is held across the call.
  contexts    np=1, two devices, memory on GPU 1: no context of GPU 0 is ever retained;
              pointers are placed without one, or in the process's own device's.
  buffers     np=1: empty arrays with data pointer 0; engine outputs freed in their
              consumer's order (the legacy stream, or after a device synchronization when
              the consumer's stream may be gone); __dlpack__(copy=True) and dl_device.
  kernel      np=1: fused groups are packed and unpacked by the batched copy kernel (run by
              the stand-in driver through the kernel's own per-thread code) when the engine
              was built with its PTX, scale factors applied in the copies; with
              FAKE_CUDA_NO_MODULES=1 (KERNEL_EXPECTED=0) the same results come from copies
              and a PreMulSum operator.
"""
import ctypes
import gc
import os
import threading
import time

import numpy as np

import collectives as hvd
from collectives import errors
from collectives._loader import engine_module
from gpu_fake_worker import FakeGpuArray, expect_error, read, run_families


class EmptyGpuArray:
    """A zero-size array as __cuda_array_interface__ producers give it: data pointer 0."""

    def __init__(self, dtype=np.float32):
        self.dtype = np.dtype(dtype)

    @property
    def __cuda_array_interface__(self):
        return {"shape": (0,), "typestr": self.dtype.str, "data": (0, False), "strides": None, "version": 3,
                "stream": None}


def fakes():
    cuda = ctypes.CDLL("libcuda.so.1")
    cuda.fake_cuda_count.argtypes = [ctypes.c_char_p]
    cuda.fake_cuda_last_free_stream.restype = ctypes.c_longlong
    nccl = ctypes.CDLL(engine_module().gpu_info()["nccl_path"])
    nccl.fake_nccl_count.argtypes = [ctypes.c_char_p]
    return (lambda what: cuda.fake_cuda_count(what.encode())), (lambda what: nccl.fake_nccl_count(what.encode())), cuda


class env:
    """Sets environment variables (read by the stand-ins on each call) for a block."""

    def __init__(self, **values):
        self.values = values

    def __enter__(self):
        os.environ.update(self.values)

    def __exit__(self, *exc):
        for key in self.values:
            del os.environ[key]


def family_agreement(chk):
    _, nccl, _ = fakes()
    me = hvd.rank()
    x = np.arange(6, dtype=np.float32)
    hvd.allreduce_(FakeGpuArray(x.copy()), name="agree.warmup")  # the communicator, before any failure
    aborted = nccl("comm_aborted")

    def everyone_fails(label, failing_rank, knob, launches, call, *fragments):
        def case():
            before = nccl(launches)
            with env(**({knob: "1"} if me == failing_rank else {})):
                expect_error(errors.InternalError, f"rank {failing_rank}", *fragments)(call)
            assert nccl(launches) == before, f"{launches} launched {nccl(launches) - before} time(s)"
        chk.check(label, case)

    everyone_fails("no fusion buffer on rank 1: every rank fails, none launches", 1, "FAKE_CUDA_OOM", "allreduce",
                   lambda: hvd.grouped_allreduce_([FakeGpuArray(x.copy()) for _ in range(3)], op=hvd.Sum,
                                                  name="agree.fused"),
                   "CUDA_ERROR_OUT_OF_MEMORY", "no member")
    everyone_fails("no allgather output on rank 0: every rank fails", 0, "FAKE_CUDA_OOM", "allgather",
                   lambda: hvd.allgather(FakeGpuArray(x), name="agree.gather"), "CUDA_ERROR_OUT_OF_MEMORY")
    everyone_fails("no alltoall output on rank 1: every rank fails", 1, "FAKE_CUDA_OOM", "group_end",
                   lambda: hvd.alltoall(FakeGpuArray(x), name="agree.a2a"), "CUDA_ERROR_OUT_OF_MEMORY")
    everyone_fails("PreMulSum fails on rank 0: every rank fails", 0, "FAKE_NCCL_FAIL_PREMUL", "allreduce",
                   lambda: hvd.allreduce_(FakeGpuArray(x.copy()), op=hvd.Sum, prescale_factor=0.5,
                                          name="agree.scaled"),
                   "ncclRedOpCreatePreMulSum", "injected PreMulSum failure")
    everyone_fails("PreMulSum fails in a reducescatter on rank 1", 1, "FAKE_NCCL_FAIL_PREMUL", "reducescatter",
                   lambda: hvd.reducescatter(FakeGpuArray(x.reshape(2, 3)), op=hvd.Average, postscale_factor=3.0,
                                             name="agree.rs"),
                   "ncclRedOpCreatePreMulSum")

    def still_usable():
        before = nccl("allreduce")
        hvd.grouped_allreduce_([FakeGpuArray(x.copy()) for _ in range(3)], op=hvd.Sum, name="agree.after")
        assert nccl("allreduce") == before + 1
        assert nccl("comm_aborted") == aborted, "a failure every member agreed on aborted the communicator"
        assert nccl("premul_destroyed") == nccl("premul_created")
    chk.check("the communicator stays usable (nothing ran out of step)", still_usable)


def family_timeout(chk):
    _, nccl, _ = fakes()
    x = np.arange(4, dtype=np.float32)
    hvd.allreduce(FakeGpuArray(x), name="timeout.warmup")

    def times_out():
        aborted = nccl("comm_aborted")
        start = time.monotonic()
        with env(FAKE_CUDA_NOT_READY_POLLS="1000000000"):
            expect_error(errors.StallTimeoutError, "did not finish within 2 s", "STALL_SHUTDOWN")(
                lambda: hvd.allreduce(FakeGpuArray(x), name="timeout.stuck"))
        took = time.monotonic() - start
        assert 1.5 < took < 30, took
        assert nccl("comm_aborted") == aborted + 1
    chk.check("a GPU wait past the stall shutdown time fails and aborts the communicator", times_out)
    chk.check("later GPU collectives on the set fail at once", lambda: expect_error(
        errors.InternalError, "did not finish")(lambda: hvd.allreduce(FakeGpuArray(x), name="timeout.after")))
    chk.check("host collectives keep working", lambda: np.testing.assert_array_equal(
        hvd.allreduce(np.ones(3), op=hvd.Sum), np.ones(3)))


def family_release(chk):
    _, nccl, _ = fakes()
    x = np.arange(4, dtype=np.float32)

    def destroyed_on_removal():
        ps = hvd.add_process_set([0])
        if hvd.rank() == 0:
            np.testing.assert_array_equal(read(hvd.allreduce(FakeGpuArray(x), op=hvd.Sum, process_set=ps)), x)
            destroyed = nccl("comm_destroyed")
        hvd.remove_process_set(ps)
        if hvd.rank() == 0:
            deadline = time.monotonic() + 10
            while nccl("comm_destroyed") == destroyed and time.monotonic() < deadline:
                time.sleep(0.01)
            assert nccl("comm_destroyed") == destroyed + 1, "the removed set's communicator is still alive"
    chk.check("removing a process set destroys its NCCL communicator", destroyed_on_removal)
    chk.check("twice", destroyed_on_removal)


def family_inprogress(chk):
    _, nccl, _ = fakes()
    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    os.environ["FAKE_NCCL_IN_PROGRESS"] = "3"
    chk.check("allreduce", lambda: np.testing.assert_array_equal(read(hvd.allreduce(FakeGpuArray(x), op=hvd.Sum)), x))
    chk.check("the calls did answer ncclInProgress", lambda: expect_positive(nccl("in_progress_returned")))

    def fused():
        arrays = [FakeGpuArray(x * i) for i in range(4)]
        hvd.grouped_allreduce_(arrays, op=hvd.Sum)
        for i, a in enumerate(arrays):
            np.testing.assert_array_equal(a.host, x * i)
    chk.check("fused allreduce", fused)
    chk.check("scaled allreduce", lambda: np.testing.assert_allclose(
        read(hvd.allreduce(FakeGpuArray(x), op=hvd.Sum, prescale_factor=2.0)), 2 * x))
    chk.check("allgather", lambda: np.testing.assert_array_equal(read(hvd.allgather(FakeGpuArray(x))), x))
    chk.check("alltoall (ncclGroupEnd)", lambda: np.testing.assert_array_equal(read(hvd.alltoall(FakeGpuArray(x))), x))
    chk.check("broadcast", lambda: np.testing.assert_array_equal(read(hvd.broadcast(FakeGpuArray(x), 0)), x))
    chk.check("reducescatter", lambda: np.testing.assert_array_equal(read(hvd.reducescatter(FakeGpuArray(x),
                                                                                             op=hvd.Sum)), x))
    del os.environ["FAKE_NCCL_IN_PROGRESS"]


def family_unlocked(chk):
    _, nccl, _ = fakes()
    x = np.arange(8, dtype=np.float32)
    hvd.allreduce(FakeGpuArray(x), name="unlocked.warmup")

    def group_end_while_waiting():
        os.environ["FAKE_CUDA_NOT_READY_POLLS"] = "1000000000"  # the completion thread keeps waiting...
        first = hvd.allreduce_async(FakeGpuArray(x), op=hvd.Sum, name="unlocked.first")
        os.environ["FAKE_NCCL_GROUP_END_NEEDS_POLL"] = "1"  # ...while ncclGroupEnd blocks until it polls
        ends = nccl("group_end")
        second = hvd.alltoall_async(FakeGpuArray(x), name="unlocked.second")
        deadline = time.monotonic() + 20
        while nccl("group_end") == ends and time.monotonic() < deadline:
            time.sleep(0.01)
        time.sleep(0.2)
        os.environ["FAKE_CUDA_NOT_READY_POLLS"] = "0"
        del os.environ["FAKE_NCCL_GROUP_END_NEEDS_POLL"]
        np.testing.assert_array_equal(read(hvd.synchronize(first)), x)
        out, received = hvd.synchronize(second)
        np.testing.assert_array_equal(read(out), x)
        assert list(received) == [8]
    chk.check("ncclGroupEnd blocks without holding the completion thread's lock", group_end_while_waiting)


def family_contexts(chk):
    cuda, _, _ = fakes()
    x = np.arange(4, dtype=np.float32)

    def placed_without_gpu0():
        np.testing.assert_array_equal(read(hvd.allreduce(FakeGpuArray(x), op=hvd.Sum)), x)
        assert hvd.basics.engine().gpu_device == 1
        assert cuda("retained0") == 0, "GPU 0's primary context was retained"
        assert cuda("retained1") >= 1
    chk.check("memory on GPU 1: GPU 0's context is never retained", placed_without_gpu0)

    def in_own_context():
        with env(FAKE_CUDA_POINTER_NEEDS_CONTEXT="1"):
            np.testing.assert_array_equal(read(hvd.allreduce(FakeGpuArray(x), op=hvd.Sum)), x)
        assert cuda("retained0") == 0
    chk.check("a driver that wants a context: asked in the process's own device's", in_own_context)

    def asked_from_a_thread():
        # A thread of its own, with no current context, places the pointer too.
        result = []
        t = threading.Thread(target=lambda: result.append(read(hvd.allreduce(FakeGpuArray(x), op=hvd.Sum))))
        t.start()
        t.join(60)
        np.testing.assert_array_equal(result[0], x)
        assert cuda("retained0") == 0
    chk.check("from another thread", asked_from_a_thread)


def family_buffers(chk):
    cuda, _, lib = fakes()
    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    hvd.allreduce(FakeGpuArray(x), name="buffers.warmup")

    def empty_arrays():
        out = hvd.allreduce(EmptyGpuArray(), op=hvd.Sum)
        assert tuple(out.shape) == (0,), out.shape
        assert tuple(hvd.allgather(EmptyGpuArray(np.int32)).shape) == (0,)
        hvd.allreduce_(EmptyGpuArray(), op=hvd.Sum)
        assert tuple(hvd.broadcast(EmptyGpuArray(), root_rank=0).shape) == (0,)
    chk.check("empty __cuda_array_interface__ arrays with data pointer 0", empty_arrays)

    def freed(stream):
        gc.collect()
        syncs = cuda("ctx_syncs")
        out = hvd.allgather(FakeGpuArray(x))
        if stream is not None:
            capsule = out.__dlpack__(stream=stream)
            del capsule  # unconsumed: the deleter drops its reference
        del out
        gc.collect()
        return lib.fake_cuda_last_free_stream(), cuda("ctx_syncs") - syncs

    def legacy_consumer():
        assert freed(1) == (1, 0), freed(1)
    chk.check("adopted on the legacy default stream: freed in its order", legacy_consumer)

    def side_stream_consumer():
        stream, syncs = freed(12345)  # a stream handle that may be destroyed before the free
        assert stream != 12345, "freed on a consumer stream that may no longer exist"
        assert syncs == 1, syncs
    chk.check("adopted on another stream: the device is synchronized, that stream is not used", side_stream_consumer)

    def never_handed_out():
        stream, syncs = freed(None)
        assert syncs == 0 and stream not in (-1, 1, 12345), (stream, syncs)  # the engine's own stream
    chk.check("never handed out: freed in the engine stream's order", never_handed_out)

    def dlpack_copy():
        out = hvd.allgather(FakeGpuArray(x))
        copies = cuda("dtod_copies")
        same = capsule_data(out.__dlpack__(stream=1, copy=False))
        assert same == out.address
        capsule = out.__dlpack__(stream=1, copy=True)
        data = capsule_data(capsule)
        assert data != out.address and cuda("dtod_copies") == copies + 1
        got = np.frombuffer(bytes((ctypes.c_char * x.nbytes).from_address(data)), dtype=np.float32).reshape(3, 4)
        np.testing.assert_array_equal(got, x)
        del capsule
        expect_error(BufferError, "CUDA device 0")(lambda: out.__dlpack__(dl_device=(1, 0)))
        assert capsule_data(out.__dlpack__(dl_device=(2, 0))) == out.address
    chk.check("__dlpack__(copy=True) exports a copy; dl_device is checked", dlpack_copy)


def family_kernel(chk):
    cuda, nccl, _ = fakes()
    hvd.allreduce(FakeGpuArray(np.ones(3, np.float32)), name="kernel.warmup")  # loads the module
    expected = os.environ.get("KERNEL_EXPECTED", "1") == "1" and cuda("module_loads") > 0
    if os.environ.get("KERNEL_EXPECTED", "1") == "1" and cuda("module_loads") == 0:
        print(f"[rank {hvd.rank()}] built without the kernel's PTX (no nvcc at build time): copies only")
    rng = np.random.default_rng(7)

    def fused(dtype, count, pre=1.0, post=1.0, op=hvd.Sum):
        launches, copies, premul = cuda("kernel_launches"), cuda("dtod_copies"), nccl("premul_created")
        sizes = [int(s) for s in rng.integers(0, 700, size=count)]  # odd sizes: unaligned tails
        arrays = [FakeGpuArray((rng.integers(-8, 8, size=n)).astype(dtype)) for n in sizes]
        want = [a.host.astype(np.float64) * pre * post for a in arrays]
        hvd.grouped_allreduce_(arrays, op=op, prescale_factor=pre, postscale_factor=post)
        for a, w in zip(arrays, want):
            np.testing.assert_allclose(a.host, w, rtol=1e-6)
        used = cuda("kernel_launches") - launches, cuda("dtod_copies") - copies, nccl("premul_created") - premul
        return used

    def plain():
        launches, copies, _ = fused(np.float32, 150)
        if expected:
            assert launches == 6 and copies == 0, (launches, copies)  # 150 in, 150 out: 3 launches each
        else:
            assert launches == 0 and copies > 0, (launches, copies)
    chk.check("a fused group of 150 tensors", plain)

    def mixed_types():
        for dtype in (np.int8, np.float16, np.float64, np.int64):
            fused(dtype, 9)
    chk.check("other dtypes", mixed_types)

    def scaled():
        for dtype in (np.float32, np.float64):
            launches, _, premul = fused(dtype, 20, pre=0.5, post=4.0)
            assert (premul == 0 and launches == 2) if expected else (premul == 1 and launches == 0), (launches, premul)
            fused(dtype, 5, pre=3.0, op=hvd.Average)  # one rank: the average is the value
    chk.check("scale factors in the copies (else a PreMulSum operator)", scaled)


def capsule_data(capsule):
    """The data pointer of a DLPack capsule (its DLTensor's first field)."""
    get = ctypes.pythonapi.PyCapsule_GetPointer
    get.restype = ctypes.c_void_p
    get.argtypes = [ctypes.py_object, ctypes.c_char_p]
    return ctypes.c_void_p.from_address(get(capsule, b"dltensor")).value


def expect_positive(n):
    assert n > 0, n


if __name__ == "__main__":
    run_families(globals())
