"""The engine's GPU path on machines without a GPU (run under mpirun).

Usage: gpu_fake_worker.py FAMILY

Families:
  nolibs        NCCL (and, where absent, the CUDA driver) not found: GPU arrays fail with a
                clear UnsupportedTypeError naming what is missing; host collectives still work.
  cuinit        a driver whose cuInit fails: the error names CUDA_ERROR_NO_DEVICE.
  fake          np=1 with tests/gpu/fakes (a CUDA driver whose device memory is host memory, NCCL
                of one rank): every verb through NCCL or staging, fusion, PreMulSum scaling,
                engine-owned outputs (DLPack, __cuda_array_interface__), one GPU per process,
                the DLPack capsule layout.
  failures      np=2, GPU work on a process set of rank 0: NCCL failures (synchronous and
                asynchronous) become exceptions with NCCL's message, not process aborts.
  initfailure   np>1 with the fake NCCL, whose ncclCommInitRank refuses more than one rank:
                every rank gets NCCL's message, and the engine keeps working.
"""
import ctypes
import gc
import os
import sys

import numpy as np

import collectives as hvd
from collectives import errors
from collectives._loader import engine_module
from common import Checker


class FakeGpuArray:
    """A "GPU array" over host memory (which the fake driver treats as device memory),
    exporting __cuda_array_interface__ like Numba or CuPy do."""

    def __init__(self, array, stream=None):
        self.host = np.ascontiguousarray(array)
        self.stream = stream

    @property
    def __cuda_array_interface__(self):
        return {"shape": self.host.shape, "typestr": self.host.dtype.str, "data": (self.host.ctypes.data, False),
                "strides": None, "version": 3, "stream": self.stream}


def read(buffer):
    """The contents of an engine-owned DeviceBuffer (host memory under the fake driver)."""
    cai = buffer.__cuda_array_interface__
    dtype = np.dtype(cai["typestr"])
    n = int(np.prod(cai["shape"])) if cai["shape"] else 1
    raw = (ctypes.c_char * (n * dtype.itemsize)).from_address(cai["data"][0])
    return np.frombuffer(bytes(raw), dtype=dtype).reshape(cai["shape"])


def expect_error(cls, *fragments):
    def check(fn):
        try:
            fn()
        except cls as e:
            for f in fragments:
                assert f in str(e), f"{f!r} not in {e!r}"
            return str(e)
        raise AssertionError(f"expected {cls.__name__}")
    return check


def family_nolibs(chk):
    info = engine_module().gpu_info()
    chk.check("nothing available", lambda: (assert_(not info["available"]), assert_("NCCL" in info["problem"] or
                                                                                    "nccl" in info["problem"])))
    chk.check("nccl_built is 0", lambda: assert_(hvd.nccl_built() == 0))
    chk.check("GPU array: UnsupportedTypeError naming the missing library", lambda: expect_error(
        errors.UnsupportedTypeError, "GPU memory", "libnccl.so.2")(lambda: hvd.allreduce(FakeGpuArray(np.ones(3)))))
    chk.check("in place too", lambda: expect_error(errors.UnsupportedTypeError, "GPU")(
        lambda: hvd.allreduce_(FakeGpuArray(np.ones(3)))))
    chk.check("allgather too", lambda: expect_error(errors.UnsupportedTypeError, "GPU")(
        lambda: hvd.allgather(FakeGpuArray(np.ones(3)))))
    if not driver_loads():
        chk.check("cuda_built is False", lambda: assert_(hvd.cuda_built() is False))
        chk.check("the driver is named", lambda: assert_("libcuda.so.1" in info["problem"]))

    # The engine itself refuses a GPU submission (the check behind the Python one).
    def engine_refuses():
        gpu = engine_module().DeviceTensor(12345, [4], 0, 0)
        sub = engine_module().submission(0, "gpu.direct", gpu, gpu, 7, 1)
        code, message, _ = hvd.basics.engine().enqueue([sub])
        assert code == 2 and "GPU memory" in message, (code, message)
    chk.check("engine refuses GPU submissions with the reason", engine_refuses)
    chk.check("host collectives unaffected", lambda: np.testing.assert_array_equal(
        hvd.allreduce(np.ones(3), op=hvd.Sum), np.full(3, hvd.size())))


def family_cuinit(chk):
    chk.check("cuInit failure is reported", lambda: expect_error(errors.InternalError, "cuInit", "CUDA_ERROR_NO_DEVICE")(
        lambda: hvd.allreduce(FakeGpuArray(np.ones(3, np.float32)))))
    chk.check("cuda_built is True (the driver was found)", lambda: assert_(hvd.cuda_built() is True))


def family_fake(chk):
    fake_cuda = ctypes.CDLL("libcuda.so.1")
    fake_nccl = ctypes.CDLL(engine_module().gpu_info()["nccl_path"])
    fake_nccl.fake_nccl_count.argtypes = [ctypes.c_char_p]
    count = lambda what: fake_nccl.fake_nccl_count(what.encode())  # noqa: E731
    info = engine_module().gpu_info()
    chk.check("libraries loaded", lambda: assert_(info["available"] and info["cuda_found"], info))
    chk.check("nccl_built is the loaded version", lambda: assert_(hvd.nccl_built() == 22304, hvd.nccl_built()))
    chk.check("cuda_built", lambda: assert_(hvd.cuda_built() is True))

    x = np.arange(12, dtype=np.float32).reshape(3, 4)

    def out_of_place():
        before = count("allreduce")
        out = hvd.allreduce(FakeGpuArray(x), op=hvd.Sum, name="oop")
        np.testing.assert_array_equal(read(out), x)
        assert count("allreduce") == before + 1
        assert hvd.basics.engine().gpu_device == 0
        assert out.__dlpack_device__() == (2, 0)
    chk.check("allreduce out of place (engine-owned output)", out_of_place)

    def scaled():
        made = count("premul_created")
        np.testing.assert_allclose(read(hvd.allreduce(FakeGpuArray(x), op=hvd.Sum, prescale_factor=2.0)), 2 * x)
        np.testing.assert_allclose(read(hvd.allreduce(FakeGpuArray(x.astype(np.float64)), op=hvd.Average,
                                                      postscale_factor=3.0)), 3 * x)
        assert count("premul_created") == made + 2 and count("premul_destroyed") == count("premul_created")
    chk.check("scale factors via ncclRedOpCreatePreMulSum", scaled)

    def average_uses_avg():
        made = count("premul_created")
        np.testing.assert_array_equal(read(hvd.allreduce(FakeGpuArray(x), op=hvd.Average)), x)
        np.testing.assert_array_equal(read(hvd.allreduce(FakeGpuArray(x.astype(np.int32)), op=hvd.Average)), x)
        assert count("premul_created") == made  # ncclAvg, no custom operator
    chk.check("Average via ncclAvg", average_uses_avg)

    def in_place():
        arr = FakeGpuArray(x * 1)
        result = hvd.allreduce_(arr, op=hvd.Max)
        assert result is arr
        np.testing.assert_array_equal(arr.host, x)
    chk.check("allreduce_ in place", in_place)

    def fused():
        before = count("allreduce")
        arrays = [FakeGpuArray(np.full(5 + i, i, np.float32)) for i in range(20)]
        outs = hvd.grouped_allreduce(arrays, op=hvd.Sum, name="fused")
        for i, o in enumerate(outs):
            np.testing.assert_array_equal(read(o), np.full(5 + i, i, np.float32))
        assert count("allreduce") == before + 1, count("allreduce") - before  # one NCCL call for all 20
        handles = [hvd.allreduce_async_(a, op=hvd.Sum, name=f"async.{i}") for i, a in enumerate(arrays)]
        for i, h in enumerate(handles):
            hvd.synchronize(h)
            np.testing.assert_array_equal(arrays[i].host, np.full(5 + i, i, np.float32))
    chk.check("small allreduces fuse into one NCCL call", fused)

    def staged():
        before = count("allreduce")
        i16 = np.arange(-6, 6, dtype=np.int16)
        np.testing.assert_array_equal(read(hvd.allreduce(FakeGpuArray(i16), op=hvd.Sum)), i16)
        np.testing.assert_allclose(read(hvd.allreduce(FakeGpuArray(x), op=hvd.Min, prescale_factor=2.0)), 2 * x)
        np.testing.assert_array_equal(read(hvd.allreduce(FakeGpuArray(i16.astype(np.int32)), op=hvd.Sum,
                                                         postscale_factor=3.0)), 3 * i16)
        assert count("allreduce") == before  # none of these went to NCCL
        rs = read(hvd.reducescatter(FakeGpuArray(i16.reshape(6, 2)), op=hvd.Sum))
        np.testing.assert_array_equal(rs, i16.reshape(6, 2))
    chk.check("reductions NCCL cannot do are staged through the host", staged)

    def broadcast():
        out = hvd.broadcast(FakeGpuArray(x), root_rank=0)
        np.testing.assert_array_equal(read(out), x)
        arr = FakeGpuArray(x * 2)
        assert hvd.broadcast_(arr, root_rank=0) is arr
        np.testing.assert_array_equal(arr.host, x * 2)
    chk.check("broadcast", broadcast)

    def allgather():
        out = hvd.allgather(FakeGpuArray(x))
        np.testing.assert_array_equal(read(out), x)
        assert tuple(out.shape) == (3, 4)
        scalar = hvd.allgather(FakeGpuArray(np.array(5.0)))
        assert tuple(scalar.shape) == (1,) and read(scalar)[0] == 5.0
        outs = hvd.grouped_allgather([FakeGpuArray(x), FakeGpuArray(x[:1].astype(np.int64))])
        np.testing.assert_array_equal(read(outs[1]), x[:1].astype(np.int64))
    chk.check("allgather (engine-owned output)", allgather)

    def alltoall():
        out, splits = hvd.alltoall(FakeGpuArray(x), splits=[3])
        np.testing.assert_array_equal(read(out), x)
        assert list(splits) == [3]
        np.testing.assert_array_equal(read(hvd.alltoall(FakeGpuArray(x))), x)
    chk.check("alltoall", alltoall)

    def reducescatter():
        before = count("reducescatter")
        np.testing.assert_array_equal(read(hvd.reducescatter(FakeGpuArray(x), op=hvd.Sum)), x)
        np.testing.assert_allclose(read(hvd.reducescatter(FakeGpuArray(x), op=hvd.Sum, prescale_factor=0.5)), x / 2)
        assert count("reducescatter") == before + 2
        outs = hvd.grouped_reducescatter([FakeGpuArray(x), FakeGpuArray(x.T.copy())], op=hvd.Average)
        np.testing.assert_array_equal(read(outs[1]), x.T)
    chk.check("reducescatter", reducescatter)

    def producer_events():
        fake_cuda.fake_cuda_stream_waits.restype = ctypes.c_int
        before = fake_cuda.fake_cuda_stream_waits()
        hvd.allreduce(FakeGpuArray(x, stream=7), op=hvd.Sum)
        assert fake_cuda.fake_cuda_stream_waits() == before + 1  # the engine stream waited on the producer
    chk.check("the engine stream waits on the producer's event", producer_events)

    def dlpack_export():
        out = hvd.allgather(FakeGpuArray(x))
        capsule = out.__dlpack__(stream=5)
        assert type(capsule).__name__ == "PyCapsule"
        del capsule  # unconsumed: the deleter runs with the capsule
        cai = out.__cuda_array_interface__
        assert cai["typestr"] == "<f4" and tuple(cai["shape"]) == (3, 4) and cai["version"] == 3
    chk.check("engine outputs export DLPack and __cuda_array_interface__", dlpack_export)

    def outputs_are_freed():
        gc.collect()
        live = fake_cuda.fake_cuda_live_allocations()
        outs = [hvd.allgather(FakeGpuArray(x)) for _ in range(5)]
        assert fake_cuda.fake_cuda_live_allocations() == live + 5
        del outs
        gc.collect()
        assert fake_cuda.fake_cuda_live_allocations() == live
    chk.check("engine-owned outputs are freed with their last reference", outputs_are_freed)

    def one_gpu_per_process():
        assert os.environ.get("FAKE_CUDA_DEVICES") == "2"  # set before init: the count is read once
        os.environ["FAKE_CUDA_POINTER_DEVICE"] = "1"
        try:
            expect_error(errors.InvalidArgumentError, "one GPU per process", "GPU 0", "GPU 1")(
                lambda: hvd.allreduce(FakeGpuArray(x)))
        finally:
            del os.environ["FAKE_CUDA_POINTER_DEVICE"]
    chk.check("one GPU per process", one_gpu_per_process)

    def mixed_group_refused():
        expect_error(errors.InvalidArgumentError, "GPU memory")(lambda: hvd.grouped_allreduce([FakeGpuArray(x), x]))
    chk.check("a group mixing GPU and host arrays is refused", mixed_group_refused)

    def host_still_fine():
        np.testing.assert_array_equal(hvd.allreduce(np.ones(3), op=hvd.Sum), np.ones(3))
    chk.check("host collectives keep working", host_still_fine)

    def dlpack_capsule_layout():
        # The capsule code of __dlpack__, over host memory so that numpy can import it.
        mod = engine_module()

        class Holder:
            def __init__(self, capsule):
                self.capsule = capsule

            def __dlpack__(self, stream=None, **kwargs):
                return self.capsule

            def __dlpack_device__(self):
                return (1, 0)

        pattern = np.arange(24, dtype=np.uint8)
        back = np.from_dlpack(Holder(mod.host_dlpack_capsule([2, 3], 7)))  # float32
        assert back.dtype == np.float32 and back.shape == (2, 3) and back.strides == (12, 4)
        np.testing.assert_array_equal(back.view(np.uint8).reshape(-1), pattern)
        flags = np.from_dlpack(Holder(mod.host_dlpack_capsule([4], 9)))  # bool
        assert flags.dtype == np.bool_
        unused = mod.host_dlpack_capsule([5], 0)
        del unused  # never consumed: its destructor frees the memory
    chk.check("DLPack capsule layout (host variant)", dlpack_capsule_layout)


def family_failures(chk):
    """NCCL failures on a process set of rank 0 alone (the fake NCCL has one rank); the other
    ranks only take part in creating and removing the sets."""
    fake_nccl = ctypes.CDLL(engine_module().gpu_info()["nccl_path"])
    fake_nccl.fake_nccl_count.argtypes = [ctypes.c_char_p]
    count = lambda what: fake_nccl.fake_nccl_count(what.encode())  # noqa: E731
    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    me = hvd.rank() == 0

    def sync_failure():
        ps = hvd.add_process_set([0])
        if me:
            hvd.allreduce(FakeGpuArray(x), process_set=ps)  # creates the set's communicator
            os.environ["FAKE_NCCL_FAIL_ALLREDUCE"] = "1"
            try:
                expect_error(errors.InternalError, "ncclAllReduce", "unhandled system error",
                             "injected allreduce failure")(lambda: hvd.allreduce(FakeGpuArray(x), process_set=ps))
            finally:
                del os.environ["FAKE_NCCL_FAIL_ALLREDUCE"]
            expect_error(errors.InternalError, "failed earlier", "injected allreduce failure")(
                lambda: hvd.allreduce(FakeGpuArray(x), process_set=ps))
        hvd.remove_process_set(ps)
    chk.check("a failing NCCL call fails its handle with NCCL's message, not the process", sync_failure)

    def async_failure():
        ps = hvd.add_process_set([0])
        if me:
            hvd.allreduce(FakeGpuArray(x), process_set=ps)
            aborted = count("comm_aborted")
            os.environ["FAKE_CUDA_NOT_READY_POLLS"] = "50"
            os.environ["FAKE_NCCL_ASYNC_ERROR"] = "1"
            try:
                expect_error(errors.InternalError, "asynchronous error", "remote process exited",
                             "fake: peer vanished")(lambda: hvd.allreduce(FakeGpuArray(x), process_set=ps))
            finally:
                del os.environ["FAKE_NCCL_ASYNC_ERROR"]
                os.environ["FAKE_CUDA_NOT_READY_POLLS"] = "0"
            assert count("comm_aborted") == aborted + 1
        hvd.remove_process_set(ps)
    chk.check("an asynchronous NCCL error aborts the communicator and fails the handle", async_failure)

    chk.check("host collectives keep working", lambda: np.testing.assert_array_equal(
        hvd.allreduce(np.ones(3), op=hvd.Sum), np.full(3, hvd.size())))


def family_initfailure(chk):
    chk.check("every rank gets NCCL's own message", lambda: expect_error(
        errors.InternalError, "ncclCommInitRank", "invalid usage", f"not {hvd.size()}")(
        lambda: hvd.allreduce(FakeGpuArray(np.ones(4, np.float32)), name="first")))
    chk.check("later GPU collectives on the set fail at once", lambda: expect_error(
        errors.InternalError, "failed earlier")(lambda: hvd.allreduce(FakeGpuArray(np.ones(4, np.float32)))))
    chk.check("host collectives keep working", lambda: np.testing.assert_array_equal(
        hvd.allreduce(np.ones(3), op=hvd.Sum), np.full(3, hvd.size())))


def assert_(cond, message=""):
    assert cond, message


def driver_loads():
    try:
        ctypes.CDLL("libcuda.so.1")
        return True
    except OSError:
        return False


def run_families(namespace):
    """The stand-in workers' main: each family named on the command line (``family_<name>`` in
    ``namespace``, the worker's globals) between init() and shutdown()."""
    hvd.init()
    chk = Checker(hvd.rank())
    for family in sys.argv[1:]:
        namespace["family_" + family](chk)
    hvd.shutdown()
    chk.finish()


if __name__ == "__main__":
    run_families(globals())
