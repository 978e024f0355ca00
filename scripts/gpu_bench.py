"""GPU benchmarks of collectives (run under mpirun, one rank per GPU, or ranks sharing one GPU
when COLLECTIVES_TEST_SHARED_GPU=1). scripts/gpu-check.sh runs it and puts the numbers in its
report. All comparisons come from the same run:

  bandwidth  256 MiB float32 allreduce_ (Sum, in place) through collectives, against a
             device-to-device copy of 256 MiB on the same GPU (the memory-speed yardstick),
             and against torch.distributed's NCCL all_reduce when it can be set up.
  fused      161 gradients of ResNet-50's parameter shapes (102 MB of float32), each with
             allreduce_async_ and then synchronized (the engine fuses them), against one
             allreduce of a flat tensor of their total size (one ncclAllReduce through
             collectives) and torch.distributed's all_reduce of that flat tensor.
  latency    an 8-byte allreduce.

Times are medians over --iters runs of the slowest rank (each run starts after a barrier);
bandwidths are algorithm bandwidth (bytes / time) and NCCL's bus bandwidth (x 2(n-1)/n).
Usage: mpirun -np N python scripts/gpu_bench.py [--iters 10] [--json out.json]
"""
import argparse
import json
import os
import statistics
import sys
import time

if os.environ.get("COLLECTIVES_TEST_SHARED_GPU") == "1":  # see tests/workers/gpu_worker.py
    _rank = os.environ.get("PMI_RANK") or os.environ.get("OMPI_COMM_WORLD_RANK") or "0"
    os.environ["NCCL_HOSTID"] = f"collectives-bench-host-{_rank}"
    for _k, _v in (("NCCL_SOCKET_IFNAME", "lo"), ("NCCL_IB_DISABLE", "1"), ("NCCL_P2P_DISABLE", "1"),
                   ("NCCL_SHM_DISABLE", "1"), ("NCCL_NVLS_ENABLE", "0"), ("NCCL_CUMEM_ENABLE", "0")):
        os.environ.setdefault(_k, _v)

import torch  # noqa: E402

import collectives.torch as hvd  # noqa: E402

MIB = 1 << 20


def resnet50_shapes():
    """The 161 parameter shapes of torchvision's ResNet-50 (25.6 M parameters)."""
    shapes = [(64, 3, 7, 7), (64,), (64,)]
    inplanes = 64
    for planes, blocks in ((64, 3), (128, 4), (256, 6), (512, 3)):
        for b in range(blocks):
            shapes += [(planes, inplanes, 1, 1), (planes,), (planes,), (planes, planes, 3, 3), (planes,), (planes,),
                       (planes * 4, planes, 1, 1), (planes * 4,), (planes * 4,)]
            if b == 0:
                shapes += [(planes * 4, inplanes, 1, 1), (planes * 4,), (planes * 4,)]
            inplanes = planes * 4
    return shapes + [(1000, 2048), (1000,)]


def timed(fn, iters, warmup=3):
    """Median seconds of fn() over iters runs, the slowest rank's per run."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(iters):
        hvd.barrier()
        start = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        mine = time.perf_counter() - start
        times.append(float(hvd.allreduce(torch.tensor([mine]), op=hvd.Max, name="bench.time")[0]))
    return statistics.median(times)


def torch_distributed():
    """torch.distributed on NCCL beside collectives (raw NCCL calls), or None."""
    try:
        import torch.distributed as dist

        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", "29533")
        dist.init_process_group("nccl", rank=hvd.rank(), world_size=hvd.size(),
                                device_id=torch.device("cuda", torch.cuda.current_device()))
        return dist
    except Exception as e:  # noqa: BLE001 - the baseline is optional
        print(f"[rank {hvd.rank()}] torch.distributed NCCL baseline unavailable: {e}", file=sys.stderr)
        return None


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--iters", type=int, default=10)
    parser.add_argument("--json", default=None)
    parser.add_argument("--no-torch-distributed", action="store_true")
    args = parser.parse_args()

    hvd.init()
    n = hvd.size()
    dev = torch.device("cuda", hvd.local_rank() % torch.cuda.device_count())
    torch.cuda.set_device(dev)
    bus = 2 * (n - 1) / n if n > 1 else 1.0
    results = {"ranks": n, "device": torch.cuda.get_device_name(dev), "nccl_version": hvd.nccl_built(),
               "shared_gpu": os.environ.get("COLLECTIVES_TEST_SHARED_GPU") == "1", "iters": args.iters}
    dist = None if args.no_torch_distributed else torch_distributed()

    # -- bandwidth
    big = torch.ones(256 * MIB // 4, device=dev)
    copy_dst = torch.empty_like(big)
    t_copy = timed(lambda: copy_dst.copy_(big), args.iters)
    t_ours = timed(lambda: hvd.allreduce_(big, op=hvd.Sum, name="bench.256MiB"), args.iters)
    results["copy_256MiB_s"] = t_copy
    results["copy_GBps"] = 256 * MIB / t_copy / 1e9  # bytes copied per second (reads + writes: twice this)
    results["allreduce_256MiB_s"] = t_ours
    results["allreduce_algbw_GBps"] = 256 * MIB / t_ours / 1e9
    results["allreduce_busbw_GBps"] = results["allreduce_algbw_GBps"] * bus
    if dist is not None:
        t = timed(lambda: dist.all_reduce(big), args.iters)
        results["torch_nccl_allreduce_256MiB_s"] = t
        results["torch_nccl_busbw_GBps"] = 256 * MIB / t / 1e9 * bus

    # -- fused ResNet-50 gradients vs one call of the total size
    grads = [torch.randn(s, device=dev) for s in resnet50_shapes()]
    total = sum(g.numel() for g in grads)
    flat = torch.randn(total, device=dev)

    def fused():
        handles = [hvd.allreduce_async_(g, op=hvd.Average, name=f"bench.grad.{i}") for i, g in enumerate(grads)]
        for h in handles:
            hvd.synchronize(h)

    results["resnet50_tensors"] = len(grads)
    results["resnet50_MB"] = total * 4 / 1e6
    results["fused_161_s"] = timed(fused, args.iters)
    results["one_call_flat_s"] = timed(lambda: hvd.allreduce_(flat, op=hvd.Average, name="bench.flat"), args.iters)
    results["fused_over_one_call"] = results["fused_161_s"] / results["one_call_flat_s"]
    if dist is not None:
        results["torch_nccl_flat_s"] = timed(lambda: dist.all_reduce(flat), args.iters)
        results["fused_over_torch_nccl_flat"] = results["fused_161_s"] / results["torch_nccl_flat_s"]

    # -- latency
    tiny = torch.ones(2, device=dev)
    results["latency_8B_s"] = timed(lambda: hvd.allreduce_(tiny, op=hvd.Sum, name="bench.tiny"), max(args.iters, 50))

    if dist is not None:
        dist.destroy_process_group()
    if hvd.rank() == 0:
        lines = [
            f"GPU benchmarks: {n} rank(s) on {results['device']}{' (shared)' if results['shared_gpu'] else ''}, "
            f"NCCL {results['nccl_version']}, medians of {args.iters}",
            f"  256 MiB device-to-device copy      {t_copy * 1e3:9.2f} ms  {results['copy_GBps']:8.1f} GB/s",
            f"  256 MiB allreduce_ (collectives)   {t_ours * 1e3:9.2f} ms  algbw {results['allreduce_algbw_GBps']:7.1f} "
            f"GB/s  busbw {results['allreduce_busbw_GBps']:7.1f} GB/s  "
            f"({results['allreduce_busbw_GBps'] / results['copy_GBps']:.2f}x the copy)",
        ]
        if "torch_nccl_allreduce_256MiB_s" in results:
            lines.append(f"  256 MiB torch.distributed NCCL     {results['torch_nccl_allreduce_256MiB_s'] * 1e3:9.2f} ms  "
                         f"busbw {results['torch_nccl_busbw_GBps']:7.1f} GB/s")
        lines += [
            f"  161 ResNet-50 gradients, fused     {results['fused_161_s'] * 1e3:9.2f} ms",
            f"  one allreduce of {results['resnet50_MB']:.0f} MB (collectives) {results['one_call_flat_s'] * 1e3:7.2f} ms"
            f"  -> fused/one call {results['fused_over_one_call']:.2f}x",
        ]
        if "torch_nccl_flat_s" in results:
            lines.append(f"  one torch.distributed all_reduce   {results['torch_nccl_flat_s'] * 1e3:9.2f} ms"
                         f"  -> fused/raw NCCL {results['fused_over_torch_nccl_flat']:.2f}x")
        lines.append(f"  8-byte allreduce latency           {results['latency_8B_s'] * 1e6:9.1f} us")
        print("\n".join(lines))
        if args.json:
            with open(args.json, "w") as f:
                json.dump(results, f, indent=1)
    hvd.shutdown()


if __name__ == "__main__":
    main()
