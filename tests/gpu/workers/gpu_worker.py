"""Collectives on GPU tensors against host references (run under mpirun; tests/gpu/test_gpu.py
launches it and skips without a GPU).

Usage: gpu_worker.py FAMILY [FAMILY ...]

Families:
  ops        every verb on torch CUDA tensors of every dtype (float16 and bfloat16 included) and
             reduce op, in place and not, scaled, grouped, uneven allgather/reducescatter,
             random alltoall splits, non-contiguous inputs; each result against numpy computed
             from every rank's inputs.
  autograd   backward of allreduce, allgather, broadcast, alltoall, reducescatter on CUDA.
  cupy       the framework-agnostic verbs on CuPy arrays (skipped when CuPy is missing).
  streams    a tensor produced on a side stream is reduced only once the stream got there;
             the collective overlaps work queued on another stream; results are usable on
             any stream once synchronize() returns.
  fusion     hundreds of small allreduces of mixed dtypes in flight at once.
  optimizer  DistributedOptimizer on CUDA: N ranks on N slices of a batch reach the parameters
             of one process on the whole batch (SGD-momentum, Adam, groups,
             backward_passes_per_step, fp16/bf16 compression), broadcast_parameters and
             broadcast_optimizer_state with CUDA state (gpu_optimizer_checks.py).
  zero       DistributedOptimizer(zero_stage=1/2) on CUDA: the same against one process, with the
             reducescatters and allgathers through NCCL, a GradScaler skip agreed over the ranks
             (gpu_optimizer_checks.py).
  errors     ranks that disagree on GPU vs CPU get a TensorMismatchError.

GPU_TEST_DEVICE=cpu runs the same checks on CPU tensors (the suite does this on machines
without a GPU, so that the checks themselves stay right).
COLLECTIVES_TEST_SHARED_GPU=1: the ranks share one GPU; each poses as its own host to NCCL
(NCCL_HOSTID) and they talk over sockets on loopback.
"""
import os
import sys
import time


def _shared_gpu_environment():
    # Before anything loads NCCL. NCCL refuses two ranks of one communicator on one GPU
    # unless they look like different hosts; then it uses its socket transport.
    if os.environ.get("COLLECTIVES_TEST_SHARED_GPU") != "1":
        return
    rank = os.environ.get("PMI_RANK") or os.environ.get("OMPI_COMM_WORLD_RANK") or "0"
    os.environ["NCCL_HOSTID"] = f"collectives-test-host-{rank}"
    for key, value in (("NCCL_SOCKET_IFNAME", "lo"), ("NCCL_IB_DISABLE", "1"), ("NCCL_P2P_DISABLE", "1"),
                       ("NCCL_SHM_DISABLE", "1"), ("NCCL_NVLS_ENABLE", "0"), ("NCCL_CUMEM_ENABLE", "0")):
        os.environ.setdefault(key, value)


_shared_gpu_environment()

import numpy as np  # noqa: E402
import torch  # noqa: E402

import collectives as hvd_core  # noqa: E402
import collectives.torch as hvd  # noqa: E402
import gpu_optimizer_checks  # noqa: E402
from common import Checker, rank_input  # noqa: E402

torch.set_num_threads(1)
ON_GPU = os.environ.get("GPU_TEST_DEVICE", "cuda") != "cpu"
DEV = None
R = N = 0

DTYPES = [torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64, torch.float16, torch.bfloat16,
          torch.float32, torch.float64, torch.bool]
REDUCE_OPS = {"Sum": hvd.Sum, "Average": hvd.Average, "Min": hvd.Min, "Max": hvd.Max, "Product": hvd.Product}
TOL = {torch.float16: 2e-3, torch.bfloat16: 2e-2, torch.float32: 1e-5, torch.float64: 1e-12}


def np_dtype(dtype):
    return {torch.bfloat16: np.float32, torch.bool: np.bool_}.get(dtype) or torch.empty(0, dtype=dtype).numpy().dtype


def make(seed, rank, shape, dtype, low=-8, high=8):
    """Rank ``rank``'s input for case ``seed`` as a tensor on this rank's device."""
    base = rank_input(seed, rank, shape, np.float64 if dtype.is_floating_point else np_dtype(dtype), low, high)
    return torch.from_numpy(np.array(base)).to(dtype).to(DEV)  # np.array keeps 0-d arrays 0-d


def host(t):
    return t.detach().to("cpu").to(torch.float64 if t.dtype.is_floating_point else t.dtype).numpy()


def close(got, want, dtype, label=""):
    got = host(got) if isinstance(got, torch.Tensor) else np.asarray(got)
    want = np.asarray(want)
    assert got.shape == want.shape, f"{label}: shape {got.shape} != {want.shape}"
    if dtype in TOL:
        np.testing.assert_allclose(got, want, rtol=TOL[dtype], atol=TOL[dtype], err_msg=label)
    else:
        np.testing.assert_array_equal(got, want.astype(got.dtype), err_msg=label)


def reduce_ref(op, arrays, dtype, prescale=1.0, postscale=1.0):
    stack = np.stack([a.astype(np.float64) for a in arrays]) * prescale
    out = {"Sum": lambda: stack.sum(0), "Average": lambda: stack.sum(0) / len(arrays), "Min": lambda: stack.min(0),
           "Max": lambda: stack.max(0), "Product": lambda: stack.prod(0)}[op]()
    if op == "Average" and not dtype.is_floating_point:
        out = np.trunc(out)  # integer averages truncate toward zero
    return out * postscale


def inputs(seed, shape, dtype, low=-8, high=8):
    return [host(make(seed, r, shape, dtype, low, high)) for r in range(N)]


# ---------------------------------------------------------------- ops

def family_ops(chk):
    seed = 100
    for dtype in DTYPES:
        ops = ["Min", "Max"] if dtype == torch.bool else list(REDUCE_OPS)
        for op in ops:
            seed += 1
            low, high = (1, 3) if op == "Product" else (-8, 8)

            def case(seed=seed, dtype=dtype, op=op, low=low, high=high):
                shape = (17, 3)
                want = reduce_ref(op, inputs(seed, shape, dtype, low, high), dtype)
                x = make(seed, R, shape, dtype, low, high)
                close(hvd.allreduce(x, op=REDUCE_OPS[op], name=f"ar.{seed}"), want, dtype, "out of place")
                y = x.clone()
                assert hvd.allreduce_(y, op=REDUCE_OPS[op], name=f"ar_.{seed}") is y
                close(y, want, dtype, "in place")
                close(x, inputs(seed, shape, dtype, low, high)[R], dtype, "input untouched")
            chk.check(f"allreduce {dtype} {op}", case)

    for dtype in (torch.float16, torch.bfloat16, torch.float32, torch.float64):
        for op, pre, post in (("Sum", 2.0, 1.0), ("Average", 1.0, 3.0), ("Average", 0.5, 4.0), ("Max", 2.0, 0.5)):
            seed += 1

            def scaled(seed=seed, dtype=dtype, op=op, pre=pre, post=post):
                want = reduce_ref(op, inputs(seed, (33,), dtype), dtype, pre, post)
                got = hvd.allreduce(make(seed, R, (33,), dtype), op=REDUCE_OPS[op], prescale_factor=pre,
                                    postscale_factor=post)
                close(got, want, dtype)
            chk.check(f"scaled allreduce {dtype} {op} pre={pre} post={post}", scaled)

    def scaled_int():  # staged through the host (NCCL has no integer pre-multiplier)
        want = reduce_ref("Sum", inputs(7, (9,), torch.int32), torch.int32, 2.0, 3.0)
        close(hvd.allreduce(make(7, R, (9,), torch.int32), op=hvd.Sum, prescale_factor=2.0, postscale_factor=3.0),
              want, torch.int32)
    chk.check("scaled integer allreduce", scaled_int)

    def edge_shapes():
        for shape in ((), (0,), (0, 4), (1 << 20,)):
            want = reduce_ref("Sum", inputs(8, shape, torch.float32), torch.float32)
            close(hvd.allreduce(make(8, R, shape, torch.float32), op=hvd.Sum), want, torch.float32, str(shape))
    chk.check("0-d, empty and 4 MiB tensors", edge_shapes)

    def non_contiguous():
        base = make(9, R, (6, 8), torch.float32)
        view = base.t()  # non-contiguous
        want = reduce_ref("Sum", [a.T for a in inputs(9, (6, 8), torch.float32)], torch.float32)
        close(hvd.allreduce(view, op=hvd.Sum), want, torch.float32, "out of place")
        hvd.allreduce_(view, op=hvd.Sum)
        close(base.t(), want, torch.float32, "in place, written back")
    chk.check("non-contiguous tensors", non_contiguous)

    def grouped():
        dts = [torch.float32, torch.float16, torch.int32, torch.bfloat16, torch.float32]
        xs = [make(20 + i, R, (5 + i, 2), dt) for i, dt in enumerate(dts)]
        outs = hvd.grouped_allreduce(xs, op=hvd.Sum)
        for i, (dt, out) in enumerate(zip(dts, outs)):
            close(out, reduce_ref("Sum", inputs(20 + i, (5 + i, 2), dt), dt), dt, f"member {i}")
        ys = [x.clone() for x in xs]
        hvd.grouped_allreduce_(ys, op=hvd.Average)
        for i, (dt, y) in enumerate(zip(dts, ys)):
            close(y, reduce_ref("Average", inputs(20 + i, (5 + i, 2), dt), dt), dt, f"in place {i}")
    chk.check("grouped allreduce", grouped)

    for dtype in DTYPES:
        def bcast(dtype=dtype):
            for root in range(N):
                want = inputs(40 + root, (4, 5), dtype, 0, 2 if dtype == torch.bool else 8)[root]
                x = make(40 + root, R, (4, 5), dtype, 0, 2 if dtype == torch.bool else 8)
                close(hvd.broadcast(x, root_rank=root), want, dtype, "out of place")
                hvd.broadcast_(x, root_rank=root)
                close(x, want, dtype, "in place")
        chk.check(f"broadcast {dtype}", bcast)

    for dtype in (torch.float32, torch.bfloat16, torch.int64, torch.bool, torch.float16):
        def gather(dtype=dtype):
            hi = 2 if dtype == torch.bool else 8
            want = np.concatenate([host(make(60, r, (r + 1, 3), dtype, 0, hi)) for r in range(N)])
            close(hvd.allgather(make(60, R, (R + 1, 3), dtype, 0, hi)), want, dtype, "uneven")
            want = np.concatenate([host(make(61, r, (2, 3), dtype, 0, hi)) for r in range(N)])
            close(hvd.allgather(make(61, R, (2, 3), dtype, 0, hi)), want, dtype, "even")
        chk.check(f"allgather {dtype}", gather)

    def gather_grouped_and_scalar():
        outs = hvd.grouped_allgather([make(62, R, (R + 1,), torch.float32), make(63, R, (2, 2), torch.int32)])
        close(outs[0], np.concatenate([host(make(62, r, (r + 1,), torch.float32)) for r in range(N)]), torch.float32)
        close(outs[1], np.concatenate([host(make(63, r, (2, 2), torch.int32)) for r in range(N)]), torch.int32)
        s = hvd.allgather(torch.tensor(float(R), device=DEV))
        close(s, np.arange(N, dtype=np.float64), torch.float32, "0-d")
    chk.check("grouped allgather, 0-d", gather_grouped_and_scalar)

    for dtype in (torch.float32, torch.float16, torch.int8, torch.bool):
        def a2a(dtype=dtype):
            splits = [[int(v) for v in np.random.default_rng([70, r]).integers(0, 4, size=N)] for r in range(N)]
            hi = 2 if dtype == torch.bool else 8
            sent = [host(make(70, r, (sum(splits[r]), 2), dtype, 0, hi)) for r in range(N)]
            want = np.concatenate([sent[p][sum(splits[p][:R]):sum(splits[p][:R + 1])] for p in range(N)])
            out, received = hvd.alltoall(make(70, R, (sum(splits[R]), 2), dtype, 0, hi),
                                         splits=torch.tensor(splits[R]))
            close(out, want, dtype)
            assert [int(v) for v in received] == [splits[p][R] for p in range(N)], received
            assert out.device.type == DEV.type
        chk.check(f"alltoall {dtype}", a2a)

    for dtype in (torch.float32, torch.bfloat16, torch.int32, torch.int16):
        for op in ("Sum", "Average"):
            def rs(dtype=dtype, op=op):
                dim0 = 2 * N + 1  # uneven: the first dim0 % N ranks get one more row
                rows = [dim0 // N + (1 if r < dim0 % N else 0) for r in range(N)]
                full = reduce_ref(op, inputs(80, (dim0, 3), dtype), dtype)
                start = sum(rows[:R])
                close(hvd.reducescatter(make(80, R, (dim0, 3), dtype), op=REDUCE_OPS[op]), full[start:start + rows[R]],
                      dtype)
                even = reduce_ref(op, inputs(81, (2 * N, 3), dtype), dtype)
                close(hvd.reducescatter(make(81, R, (2 * N, 3), dtype), op=REDUCE_OPS[op]), even[2 * R:2 * R + 2], dtype)
            chk.check(f"reducescatter {dtype} {op}", rs)

    def rs_grouped_scaled():
        outs = hvd.grouped_reducescatter([make(82, R, (N, 2), torch.float32), make(83, R, (2 * N,), torch.float64)],
                                         op=hvd.Sum, prescale_factor=0.5)
        close(outs[0], reduce_ref("Sum", inputs(82, (N, 2), torch.float32), torch.float32, 0.5)[R:R + 1],
              torch.float32)
        close(outs[1], reduce_ref("Sum", inputs(83, (2 * N,), torch.float64), torch.float64, 0.5)[2 * R:2 * R + 2],
              torch.float64)
    chk.check("grouped, scaled reducescatter", rs_grouped_scaled)

    def result_devices():
        x = make(90, R, (3,), torch.float32)
        for out in (hvd.allreduce(x), hvd.allgather(x), hvd.broadcast(x, 0), hvd.alltoall(x.repeat(N)),
                    hvd.reducescatter(x.repeat(N))):
            assert out.device == x.device, out.device
    chk.check("results on the input's device", result_devices)


# ---------------------------------------------------------------- autograd

def family_autograd(chk):
    def allreduce_grad():
        x = make(200, R, (4, 3), torch.float64).requires_grad_()
        hvd.allreduce(x, op=hvd.Sum, name="ag.ar").sum().backward()
        close(x.grad, np.full((4, 3), float(N)), torch.float64)
    chk.check("allreduce backward", allreduce_grad)

    def allgather_grad():
        x = make(201, R, (R + 1, 2), torch.float64).requires_grad_()
        y = hvd.allgather(x, name="ag.ag")
        (y * 2).sum().backward()
        close(x.grad, np.full((R + 1, 2), 2.0), torch.float64)  # Horovod's Average of the gradients
    chk.check("allgather backward", allgather_grad)

    def broadcast_grad():
        x = make(202, R, (3,), torch.float64).requires_grad_()
        hvd.broadcast(x, root_rank=0, name="ag.bc").sum().backward()
        close(x.grad, np.full(3, 1.0 if R == 0 else 0.0), torch.float64)  # Average on the root, zeros elsewhere
    chk.check("broadcast backward", broadcast_grad)

    def alltoall_grad():
        x = make(203, R, (2 * N, 2), torch.float64).requires_grad_()
        out, _ = hvd.alltoall(x, splits=[2] * N, name="ag.a2a")
        (out * 3).sum().backward()
        close(x.grad, np.full((2 * N, 2), 3.0), torch.float64)
    chk.check("alltoall backward", alltoall_grad)

    def reducescatter_grad():
        x = make(204, R, (N, 2), torch.float64).requires_grad_()
        hvd.reducescatter(x, op=hvd.Sum, name="ag.rs").sum().backward()
        close(x.grad, np.full((N, 2), float(N)), torch.float64)  # Horovod's: allgather(dy) times n for Sum
    chk.check("reducescatter backward", reducescatter_grad)


# ---------------------------------------------------------------- cupy

def family_cupy(chk):
    try:
        import cupy
    except ImportError:
        print(f"[rank {R}] cupy family skipped: CuPy is not installed")
        return
    if not ON_GPU:
        return
    cupy.cuda.Device(DEV.index).use()

    def ops():
        for dtype in (np.float32, np.float64, np.int32, np.float16):
            want = np.sum([rank_input(300, r, (5, 4), dtype).astype(np.float64) for r in range(N)], axis=0)
            x = cupy.asarray(rank_input(300, R, (5, 4), dtype))
            out = hvd_core.allreduce(x, op=hvd_core.Sum)
            assert isinstance(out, cupy.ndarray), type(out)
            np.testing.assert_allclose(cupy.asnumpy(out), want, rtol=1e-3)
            assert hvd_core.allreduce_(x, op=hvd_core.Sum) is x
            np.testing.assert_allclose(cupy.asnumpy(x), want, rtol=1e-3)
    chk.check("cupy allreduce (out of place and in place)", ops)

    def others():
        g = hvd_core.allgather(cupy.asarray(rank_input(301, R, (R + 1, 2), np.float32)))
        assert isinstance(g, cupy.ndarray), type(g)
        np.testing.assert_array_equal(cupy.asnumpy(g), np.concatenate(
            [rank_input(301, r, (r + 1, 2), np.float32) for r in range(N)]))
        b = hvd_core.broadcast(cupy.asarray(rank_input(302, R, (3,), np.int64)), root_rank=0)
        np.testing.assert_array_equal(cupy.asnumpy(b), rank_input(302, 0, (3,), np.int64))
        rs = hvd_core.reducescatter(cupy.asarray(rank_input(303, R, (N, 2), np.float32)), op=hvd_core.Sum)
        np.testing.assert_allclose(cupy.asnumpy(rs), np.sum([rank_input(303, r, (N, 2), np.float32)
                                                             for r in range(N)], axis=0)[R:R + 1])
        a2a = hvd_core.alltoall(cupy.asarray(rank_input(304, R, (N, 2), np.float32)))  # row p goes to rank p
        np.testing.assert_array_equal(cupy.asnumpy(a2a), np.stack([rank_input(304, p, (N, 2), np.float32)[R]
                                                                   for p in range(N)]))
    chk.check("cupy allgather, broadcast, reducescatter, alltoall", others)

    def side_stream():
        s = cupy.cuda.Stream(non_blocking=True)
        with s:
            x = cupy.full((1 << 16,), R + 1, dtype=cupy.float32)
            out = hvd_core.allreduce(x, op=hvd_core.Sum, name="cupy.stream")
        assert float(out[0]) == N * (N + 1) / 2
    chk.check("cupy array on a side stream", side_stream)


# ---------------------------------------------------------------- streams

def family_streams(chk):
    if not ON_GPU:
        return
    hvd.allreduce(torch.ones(4, device=DEV), name="streams.warmup")  # communicator created outside the timings
    cycles = int(os.environ.get("GPU_TEST_SLEEP_CYCLES", "400000000"))  # ~0.2-0.3 s at 1.5-2 GHz

    def producer_waited_for():
        side = torch.cuda.Stream(device=DEV)
        with torch.cuda.stream(side):
            x = torch.zeros(1 << 20, device=DEV)
            torch.cuda._sleep(cycles)  # the value below arrives only after this
            x.fill_(R + 1)
            h = hvd.allreduce_async(x, op=hvd.Sum, name="streams.producer")
        out = hvd.synchronize(h)
        assert torch.all(out == N * (N + 1) / 2).item(), out[:4]
    chk.check("a tensor produced on a side stream is reduced after its producer", producer_waited_for)

    def overlap():
        x = torch.full((1 << 20,), float(R + 1), device=DEV)
        torch.cuda.synchronize(DEV)
        torch.cuda._sleep(cycles)  # the default stream is busy...
        side = torch.cuda.Stream(device=DEV)
        start = time.perf_counter()
        with torch.cuda.stream(side):
            out = hvd.allreduce(x, op=hvd.Sum, name="streams.overlap")  # ...while the collective runs
        took = time.perf_counter() - start
        busy = not torch.cuda.default_stream(DEV).query()
        torch.cuda.synchronize(DEV)
        assert torch.all(out == N * (N + 1) / 2).item()
        assert busy, f"the collective waited for the default stream's work ({took * 1e3:.1f} ms)"
    chk.check("the collective overlaps work on another stream", overlap)

    def consumer_any_stream():
        side = torch.cuda.Stream(device=DEV)
        out = hvd.allgather(torch.full((2,), float(R), device=DEV), name="streams.consumer")
        with torch.cuda.stream(side):
            total = out.sum()
        side.synchronize()
        assert total.item() == 2 * sum(range(N))
    chk.check("results may be read on any stream after synchronize", consumer_any_stream)


# ---------------------------------------------------------------- fusion

def family_fusion(chk):
    def many():
        rng = np.random.default_rng(500)
        dts = [torch.float32, torch.float16, torch.bfloat16, torch.float64, torch.int32]
        cases = [(int(rng.integers(1, 5000)), dts[i % len(dts)]) for i in range(300)]
        xs = [make(1000 + i, R, (n,), dt) for i, (n, dt) in enumerate(cases)]
        handles = [hvd.allreduce_async_(x, op=hvd.Sum, name=f"fusion.{i}") for i, x in enumerate(xs)]
        for h in handles:
            hvd.synchronize(h)
        for i, ((n, dt), x) in enumerate(zip(cases, xs)):
            close(x, reduce_ref("Sum", inputs(1000 + i, (n,), dt), dt), dt, f"tensor {i}")
    chk.check("300 small allreduces of mixed dtypes in flight", many)

    def resnet_like():
        shapes = [(64, 3, 7, 7)] + [(256, 64, 1, 1), (64,), (64,)] * 30 + [(2048, 1000 // 8)]
        xs = [make(2000 + i, R, s, torch.float32) for i, s in enumerate(shapes)]
        outs = [hvd.allreduce_async(x, op=hvd.Average, name=f"resnet.{i}") for i, x in enumerate(xs)]
        for i, (s, h) in enumerate(zip(shapes, outs)):
            close(hvd.synchronize(h), reduce_ref("Average", inputs(2000 + i, s, torch.float32), torch.float32),
                  torch.float32, f"tensor {i}")
    chk.check("ResNet-like gradient shapes", resnet_like)


# ---------------------------------------------------------------- optimizer

def family_optimizer(chk):
    gpu_optimizer_checks.family_optimizer(chk, DEV, R, N)


def family_zero(chk):
    gpu_optimizer_checks.family_zero(chk, DEV, R, N)


# ---------------------------------------------------------------- errors

def family_errors(chk):
    if N < 2:
        return

    def mismatch():
        x = torch.ones(3, device=DEV if R == 0 else "cpu")
        try:
            hvd.allreduce(x, name="errors.device")
        except hvd_core.TensorMismatchError as e:
            assert "GPU" in str(e) and "cpu" in str(e), e
            return
        raise AssertionError("no TensorMismatchError")
    if ON_GPU:
        chk.check("GPU on one rank, CPU on another: TensorMismatchError on every rank", mismatch)

    def still_fine():
        close(hvd.allreduce(torch.ones(3, device=DEV), op=hvd.Sum, name="errors.after"), np.full(3, float(N)),
              torch.float32)
    chk.check("collectives work after the error", still_fine)


def main():
    global DEV, R, N
    hvd.init()
    R, N = hvd.rank(), hvd.size()
    if ON_GPU:
        DEV = torch.device("cuda", hvd.local_rank() % torch.cuda.device_count())
        torch.cuda.set_device(DEV)
    else:
        DEV = torch.device("cpu")
    chk = Checker(R)
    for family in sys.argv[1:]:
        before = chk.count
        globals()["family_" + family](chk)
        sys.stdout.write(f"[rank {R}] family {family}: {chk.count - before} cases\n")  # one write: ranks share stdout
        sys.stdout.flush()  # (tests/gpu/test_gpu.py counts these lines)
    if ON_GPU:
        torch.cuda.synchronize(DEV)
    hvd.shutdown()
    chk.finish()


if __name__ == "__main__":
    main()
