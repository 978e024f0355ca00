"""GPU benchmarks of collectives (run under mpirun, one rank per GPU, or ranks sharing one GPU
when COLLECTIVES_TEST_SHARED_GPU=1). scripts/gpu-check.sh runs it and puts the figures in its
report. All comparisons come from the same launch:

  bandwidth  a 256 MiB float32 allreduce_ (Sum, in place) through collectives, against a raw
             ncclAllReduce of the same buffer (torch.distributed's NCCL backend) and a
             device-to-device copy of 256 MiB (the memory-speed yardstick).
  fused      the 161 gradients of ResNet-50's parameter shapes (102 MB of float32), each with
             allreduce_async_ and then synchronized (the engine fuses them), against one raw
             ncclAllReduce of a flat tensor of their total size, and one collectives call of it.
  latency    an 8-byte allreduce, and a raw ncclAllReduce of it.
  train      a ResNet-50 training step (SGD-momentum, synthetic ImageNet batch) with
             DistributedOptimizer against torch DDP (NCCL) on a copy of the same model.

Times are medians over --iters runs of the slowest rank (each run starts after a barrier).
The JSON (rank 0) is rewritten after each section, and sections that would start after
--time-limit seconds are skipped (noted), so a launch under a time limit reports what it did.

Usage: mpirun -np N python scripts/gpu_bench.py [--iters 10] [--json out.json] [--time-limit S]
                                              [--sections bandwidth,fused,latency,train]
       mpirun -np 2 python scripts/gpu_bench.py --probe   (can two ranks share this GPU?)
"""
import argparse
import datetime
import json
import os
import statistics
import sys
import time

if os.environ.get("COLLECTIVES_TEST_SHARED_GPU") == "1":  # see tests/gpu/workers/gpu_worker.py
    _rank = (os.environ.get("PMI_RANK") or os.environ.get("OMPI_COMM_WORLD_RANK") or os.environ.get("PMIX_RANK")
             or "0")
    os.environ["NCCL_HOSTID"] = f"collectives-bench-host-{_rank}"
    for _k, _v in (("NCCL_SOCKET_IFNAME", "lo"), ("NCCL_IB_DISABLE", "1"), ("NCCL_P2P_DISABLE", "1"),
                   ("NCCL_SHM_DISABLE", "1"), ("NCCL_NVLS_ENABLE", "0"), ("NCCL_CUMEM_ENABLE", "0")):
        os.environ.setdefault(_k, _v)

import torch  # noqa: E402

import collectives.torch as hvd  # noqa: E402

MIB = 1 << 20
T0 = time.monotonic()


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


def allreduce_launches():
    """ncclAllReduce calls this rank's engine made so far (None: an engine without the counter)."""
    from collectives import basics

    return getattr(basics.engine(), "gpu_allreduce_launches", None)


def launches_per_run(measure, fn):
    """measure(fn)'s result (it runs fn some times: warm-up and timed runs), and the NCCL
    allreduce calls per run of fn."""
    runs = 0

    def counted():
        nonlocal runs
        runs += 1
        fn()

    before = allreduce_launches()
    result = measure(counted)
    after = allreduce_launches()
    return result, (None if before is None or not runs else (after - before) / runs)


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


def raw_nccl(dev):
    """torch.distributed on NCCL beside collectives (raw NCCL calls), or (None, why)."""
    try:
        import torch.distributed as dist

        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", "29533")
        dist.init_process_group("nccl", rank=hvd.rank(), world_size=hvd.size(), device_id=dev,
                                timeout=datetime.timedelta(seconds=120))
        return dist, ""
    except Exception as e:  # noqa: BLE001 - the baseline is optional; the report says why it is missing
        return None, f"torch.distributed NCCL unavailable: {e}"


def probe():
    """Two ranks on one GPU: a GPU allreduce and allgather through collectives."""
    hvd.init()
    torch.cuda.set_device(0)
    x = torch.full((1 << 20,), float(hvd.rank() + 1), device="cuda")
    ok = bool(torch.all(hvd.allreduce(x, op=hvd.Sum, name="probe.ar") == hvd.size() * (hvd.size() + 1) / 2).item())
    ok = ok and hvd.allgather(x[:2], name="probe.ag").shape[0] == 2 * hvd.size()
    print(f"[rank {hvd.rank()}] {hvd.size()} ranks on one GPU: {'ok' if ok else 'WRONG RESULT'}", flush=True)
    hvd.shutdown()
    return 0 if ok else 1


class Bench:
    def __init__(self, args):
        self.args = args
        self.n = hvd.size()
        self.dev = torch.device("cuda", hvd.local_rank() % torch.cuda.device_count())
        torch.cuda.set_device(self.dev)
        self.bus = 2 * (self.n - 1) / self.n if self.n > 1 else 1.0
        self.r = {"ranks": self.n, "device": torch.cuda.get_device_name(self.dev), "nccl_version": hvd.nccl_built(),
                  "shared_gpu": os.environ.get("COLLECTIVES_TEST_SHARED_GPU") == "1", "iters": args.iters,
                  "gpu_fusion_wait": os.environ.get("COLLECTIVES_GPU_FUSION_WAIT", "1") != "0",
                  "gpu_fusion_wait_ms": os.environ.get("COLLECTIVES_GPU_FUSION_WAIT_MS", "default"),
                  "notes": []}
        self.dist, why = raw_nccl(self.dev)
        # Every rank uses the baseline or none does (a rank alone in all_reduce would wait forever).
        everywhere = float(hvd.allreduce(torch.tensor([1.0 if self.dist else 0.0]), op=hvd.Min, name="bench.raw"))
        if self.dist and not everywhere:
            self.dist.destroy_process_group()
            self.dist, why = None, "torch.distributed NCCL failed on another rank"
        self.r["raw_backend"] = "torch.distributed NCCL" if self.dist else "none"
        if why:
            self.r["notes"].append(why)

    def due(self, section):
        """False (and a note) when the section would start past the time limit."""
        left = self.args.time_limit - (time.monotonic() - T0)
        # Every rank decides the same: the slowest rank's view.
        late = float(hvd.allreduce(torch.tensor([0.0 if left > 0 else 1.0]), op=hvd.Max, name=f"bench.due.{section}"))
        if late:
            self.r["notes"].append(f"{section}: skipped (time limit {self.args.time_limit} s)")
        return not late

    def save(self):
        if hvd.rank() == 0 and self.args.json:
            with open(self.args.json, "w") as f:
                json.dump(self.r, f, indent=1)

    def bandwidth(self):
        big = torch.ones(256 * MIB // 4, device=self.dev)
        dst = torch.empty_like(big)
        self.r["copy_256MiB_s"] = timed(lambda: dst.copy_(big), self.args.iters)
        self.r["copy_GBps"] = 256 * MIB / self.r["copy_256MiB_s"] / 1e9  # bytes copied per second
        t = timed(lambda: hvd.allreduce_(big, op=hvd.Sum, name="bench.256MiB"), self.args.iters)
        self.r["allreduce_256MiB_s"] = t
        self.r["allreduce_busbw_GBps"] = 256 * MIB / t / 1e9 * self.bus
        if self.dist:
            self.r["raw_allreduce_256MiB_s"] = timed(lambda: self.dist.all_reduce(big), self.args.iters)
        del big, dst

    def fused(self):
        grads = [torch.randn(s, device=self.dev) for s in resnet50_shapes()]
        total = sum(g.numel() for g in grads)
        flat = torch.randn(total, device=self.dev)

        def fused():
            handles = [hvd.allreduce_async_(g, op=hvd.Average, name=f"bench.grad.{i}") for i, g in enumerate(grads)]
            for h in handles:
                hvd.synchronize(h)

        self.r["resnet50_tensors"] = len(grads)
        self.r["resnet50_MB"] = total * 4 / 1e6
        self.r["fused_161_s"], self.r["fused_161_launches"] = launches_per_run(
            lambda f: timed(f, self.args.iters), fused)
        self.r["one_call_flat_s"] = timed(lambda: hvd.allreduce_(flat, op=hvd.Average, name="bench.flat"),
                                          self.args.iters)
        if self.dist:
            self.r["raw_flat_s"] = timed(lambda: self.dist.all_reduce(flat), self.args.iters)

    def latency(self):
        tiny = torch.ones(2, device=self.dev)
        self.r["latency_8B_s"] = timed(lambda: hvd.allreduce_(tiny, op=hvd.Sum, name="bench.tiny"),
                                       max(self.args.iters, 50))
        if self.dist:
            self.r["raw_latency_8B_s"] = timed(lambda: self.dist.all_reduce(tiny), max(self.args.iters, 50))

    def train(self):
        try:
            import torchvision
        except ImportError as e:
            self.r["train_skipped"] = f"no torchvision: {e}"
            return
        if not self.dist:
            self.r["train_skipped"] = "no torch.distributed NCCL for DDP"
            return
        torch.backends.cudnn.benchmark = True
        batch = self.args.train_batch
        self.r["train_batch"] = batch
        torch.manual_seed(0)
        data = torch.randn(batch, 3, 224, 224, device=self.dev)
        target = torch.randint(0, 1000, (batch,), device=self.dev)
        loss_fn = torch.nn.CrossEntropyLoss()

        model = torchvision.models.resnet50().to(self.dev)
        hvd.broadcast_parameters(model.state_dict(), root_rank=0)
        opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9),
                                       named_parameters=model.named_parameters())

        def ours():
            opt.zero_grad()
            loss_fn(model(data), target).backward()
            opt.step()

        ddp_model = torchvision.models.resnet50().to(self.dev)
        ddp_model.load_state_dict(model.state_dict())
        ddp = torch.nn.parallel.DistributedDataParallel(ddp_model, device_ids=[self.dev.index])
        ddp_opt = torch.optim.SGD(ddp.parameters(), lr=0.01, momentum=0.9)

        def theirs():
            ddp_opt.zero_grad()
            loss_fn(ddp(data), target).backward()
            ddp_opt.step()

        # Two rounds, alternating, so that neither side gets only the warm (or cold) GPU.
        a, b, calls = [], [], []
        for _ in range(2):
            t, n = launches_per_run(lambda f: timed(f, self.args.train_steps, warmup=3), ours)
            a.append(t)
            calls.append(n)
            b.append(timed(theirs, self.args.train_steps, warmup=3))
        self.r["train_ours_s"], self.r["train_ddp_s"] = min(a), min(b)
        self.r["train_ours_launches_per_step"] = calls
        self.r["train_ours_rounds_s"], self.r["train_ddp_rounds_s"] = a, b

    def run(self):
        for section in self.args.sections.split(","):
            if not self.due(section):
                continue
            start = time.monotonic()
            getattr(self, section)()
            torch.cuda.synchronize()
            self.r[f"{section}_section_s"] = time.monotonic() - start
            self.save()
        if hvd.rank() == 0:
            print(json.dumps(self.r, indent=1))
        if self.dist:
            self.dist.destroy_process_group()


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--iters", type=int, default=10)
    parser.add_argument("--train-steps", type=int, default=10)
    parser.add_argument("--train-batch", type=int, default=32)
    parser.add_argument("--json", default=None)
    parser.add_argument("--time-limit", type=float, default=1e9, help="skip sections that would start after this")
    parser.add_argument("--sections", default="bandwidth,fused,latency,train",
                        help="which sections, in order (comma-separated)")
    parser.add_argument("--probe", action="store_true")
    args = parser.parse_args()
    if args.probe:
        sys.exit(probe())
    hvd.init()
    Bench(args).run()
    hvd.shutdown()


if __name__ == "__main__":
    main()
