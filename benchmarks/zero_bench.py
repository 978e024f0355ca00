"""Sharded optimizer state (``DistributedOptimizer(zero_stage=...)``, docs/zero.md): memory per rank
and step time, printed as one table from one run (issue 36).

Run with:  .venv/bin/python benchmarks/zero_bench.py [--rounds 5] [--steps 4] [--plot docs/zero_memory.png]

The driver (this script without mpirun) launches the workers (this script under mpirun, --worker):

* memory: one launch per (ranks N = 1, 2, 3; zero_stage 0, 1, 2), so that each peak RSS is its
  own process's. A ~25M-parameter MLP with Adam takes two steps; then, per rank, the optimizer
  state's bytes counted from its state tensors, the gradient bytes held after ``synchronize()``
  (``p.grad`` and the reduced shards), and the peak RSS (``ru_maxrss``), the largest over ranks.
* time at 2 ranks: our unsharded ``DistributedOptimizer`` and stages 1 and 2, against DDP with
  torch's ``ZeroRedundancyOptimizer`` (gloo), each on its own copy of the model, in interleaved
  rounds (the order rotating); a round's figure is the median step of the slowest rank, each
  step starting after a barrier; the table gives the median over rounds and the median of the
  per-round ratios to our unsharded step. DeepSpeed is tried if it imports (it does not here:
  see docs/zero.md).

``--device cuda`` (scripts/gpu-check.sh): the same on one GPU per rank, over NCCL (the peer over
torch's NCCL backend instead of gloo), memory as the device's peak allocation.
``--params`` sets the model size (the smoke test in tests/project uses a tiny one).
"""
import argparse
import json
import os
import resource
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

if os.environ.get("COLLECTIVES_TEST_SHARED_GPU") == "1":  # ranks sharing one GPU: as scripts/gpu_bench.py
    _rank = os.environ.get("PMI_RANK") or os.environ.get("OMPI_COMM_WORLD_RANK") or os.environ.get("PMIX_RANK")
    if _rank is not None:
        os.environ["NCCL_HOSTID"] = f"collectives-zero-bench-host-{_rank}"
        for _k, _v in (("NCCL_SOCKET_IFNAME", "lo"), ("NCCL_IB_DISABLE", "1"), ("NCCL_P2P_DISABLE", "1"),
                       ("NCCL_SHM_DISABLE", "1"), ("NCCL_NVLS_ENABLE", "0"), ("NCCL_CUMEM_ENABLE", "0")):
            os.environ.setdefault(_k, _v)

MiB = 1024 * 1024


def mlp(params, torch):
    """An MLP of about ``params`` parameters: width w, layers w->4w->4w->w (about 24 w^2)."""
    w = max(4, int((params / 24) ** 0.5))
    return torch.nn.Sequential(torch.nn.Linear(w, 4 * w), torch.nn.ReLU(), torch.nn.Linear(4 * w, 4 * w),
                               torch.nn.ReLU(), torch.nn.Linear(4 * w, w)), w


# ---------------------------------------------------------------- workers (under mpirun)

def _tensor_bytes(values):
    import torch
    return sum(v.numel() * v.element_size() for v in values if isinstance(v, torch.Tensor))


def state_bytes(opt):
    inner = getattr(opt, "_inner", None)
    state = inner.state if inner is not None else opt.state
    return sum(_tensor_bytes(st.values()) for st in state.values())


def grad_bytes(model, opt):
    shards = getattr(opt, "_shards", [])
    return _tensor_bytes([p.grad for p in model.parameters()] + [s.grad for s in shards])


def worker_memory(args, hvd, torch, dev):
    torch.manual_seed(0)
    model, width = mlp(args.params, torch)
    model.to(dev)
    opt = hvd.DistributedOptimizer(torch.optim.Adam(model.parameters(), lr=1e-4),
                                   named_parameters=model.named_parameters(), zero_stage=args.stage)
    x = torch.randn(args.batch, width, device=dev)
    held = 0
    for _ in range(2):
        opt.zero_grad()
        model(x).pow(2).mean().backward()
        opt.synchronize()
        held = grad_bytes(model, opt)
        with opt.skip_synchronize():
            opt.step()
    if dev.type == "cuda":
        torch.cuda.synchronize()
        peak = torch.cuda.max_memory_allocated(dev)
    else:
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    mine = [state_bytes(opt), held, peak]
    return {"params": sum(p.numel() for p in model.parameters()),
            "max": [max(col) for col in zip(*hvd.allgather_object(mine))]}


def _ddp_zero(torch, dev, model):
    """DDP + torch's ZeroRedundancyOptimizer on torch.distributed (gloo, or NCCL on a GPU)."""
    import torch.distributed as dist
    from torch.distributed.optim import ZeroRedundancyOptimizer
    ddp = torch.nn.parallel.DistributedDataParallel(model, device_ids=[dev.index] if dev.type == "cuda" else None)
    opt = ZeroRedundancyOptimizer(ddp.parameters(), optimizer_class=torch.optim.Adam, lr=1e-4)
    return ddp, opt, dist.barrier


def _init_torch_distributed(hvd, dev):
    import socket

    import torch.distributed as dist
    port = None
    if hvd.rank() == 0:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
    port = hvd.broadcast_object(port, 0)
    dist.init_process_group("nccl" if dev.type == "cuda" else "gloo", init_method=f"tcp://127.0.0.1:{port}",
                            rank=hvd.rank(), world_size=hvd.size())


def worker_time(args, hvd, torch, dev):
    _init_torch_distributed(hvd, dev)
    torch.manual_seed(0)
    base, width = mlp(args.params, torch)
    variants = {}
    for stage in (0, 1, 2):
        model = mlp(args.params, torch)[0].to(dev)
        model.load_state_dict(base.state_dict())
        opt = hvd.DistributedOptimizer(torch.optim.Adam(model.parameters(), lr=1e-4),
                                       named_parameters=model.named_parameters(), zero_stage=stage)
        variants[f"ours stage {stage}" if stage else "ours unsharded"] = (model, opt)
    model = mlp(args.params, torch)[0].to(dev)
    model.load_state_dict(base.state_dict())
    ddp, zopt, _ = _ddp_zero(torch, dev, model)
    variants["DDP + ZeroRedundancyOptimizer"] = (ddp, zopt)
    x = torch.randn(args.batch, width, device=dev)

    def one_step(model, opt):
        opt.zero_grad()
        model(x).pow(2).mean().backward()
        opt.step()
        if dev.type == "cuda":
            torch.cuda.synchronize()

    for model, opt in variants.values():  # warm-up: state allocated, buckets built
        one_step(model, opt)
    from machine_info import rotated
    names = list(variants)
    per_round = {name: [] for name in names}
    for _, name in rotated(names, args.rounds):
        times = []
        for _ in range(args.steps):
            hvd.barrier()
            t0 = time.perf_counter()
            one_step(*variants[name])
            times.append(time.perf_counter() - t0)
        slowest = max(hvd.allgather_object(statistics.median(times)))
        per_round[name].append(slowest)
    return {"per_round": per_round, "deepspeed": deepspeed_note()}


def deepspeed_note():
    try:
        import deepspeed  # noqa: F401
    except Exception as e:  # noqa: BLE001 - any failure to import is the answer
        return f"not run: deepspeed does not import here ({type(e).__name__}: {str(e).splitlines()[0][:120]})"
    return "not run: deepspeed imports, but this benchmark has no CPU accelerator set up for it"


def worker(args):
    import torch

    import collectives.torch as hvd
    torch.set_num_threads(1)
    hvd.init()
    dev = torch.device("cpu")
    if args.device == "cuda":
        dev = torch.device("cuda", hvd.local_rank() % torch.cuda.device_count())
        torch.cuda.set_device(dev)
    result = (worker_memory if args.worker == "memory" else worker_time)(args, hvd, torch, dev)
    if hvd.rank() == 0 and args.json:
        with open(args.json, "w") as f:
            json.dump(result, f)
    hvd.shutdown()


# ---------------------------------------------------------------- driver

def table(memory, timing, rounds, steps, device):
    lines = ["| ranks | zero_stage | optimizer state per rank (MiB) | gradients held after synchronize (MiB) | "
             f"peak {'GPU memory' if device == 'cuda' else 'RSS'} per rank (MiB) |",
             "|---|---|---|---|---|"]
    for (n, stage), m in sorted(memory.items()):
        s, g, peak = m["max"]
        lines.append(f"| {n} | {stage} | {s / MiB:.1f} | {g / MiB:.1f} | {peak / MiB:.0f} |")
    per_round = timing["per_round"]
    ref = per_round["ours unsharded"]
    lines += ["", f"| step at 2 ranks ({rounds} rounds x {steps} steps) | median ms | ratio to ours unsharded |",
              "|---|---|---|"]
    for name, times in per_round.items():
        ratio = statistics.median(t / r for t, r in zip(times, ref))
        lines.append(f"| {name} | {statistics.median(times) * 1e3:.1f} | {ratio:.2f} |")
    lines.append(f"| DeepSpeed ZeRO 1/2 | {timing['deepspeed']} | |")
    return "\n".join(lines)


def plot(memory, path, captions):
    from plot_common import import_pyplot, save_figure
    plt = import_pyplot()
    fig, (a, b) = plt.subplots(1, 2, figsize=(9, 4.2))
    fig.subplots_adjust(bottom=0.3, wspace=0.3)
    ns = sorted({n for n, _ in memory})
    for stage in (0, 1, 2):
        label = "unsharded" if stage == 0 else f"zero_stage={stage}"
        a.plot(ns, [memory[(n, stage)]["max"][0] / MiB for n in ns], marker="o", label=label)
        b.plot(ns, [(memory[(n, stage)]["max"][0] + memory[(n, stage)]["max"][1]) / MiB for n in ns], marker="o",
               label=label)
    a.set_title("Adam state per rank (MiB)", fontsize=9)
    b.set_title("state + gradients held per rank (MiB)", fontsize=9)
    for ax in (a, b):
        ax.set_xlabel("ranks")
        ax.set_xticks(ns)
        ax.set_ylim(bottom=0)
        ax.legend(fontsize=8)
    save_figure(fig, path, captions)


def driver(args):
    from machine_info import describe_load, describe_machine, load_average, utc_now
    from plot_common import run_mpi_worker, venv_of_this_python
    venv = venv_of_this_python()
    loads_before = load_average()
    common = ["--params", args.params, "--batch", args.batch, "--device", args.device]
    memory = {}
    for n in args.ranks:
        for stage in (0, 1, 2):
            memory[(n, stage)] = run_mpi_worker(venv, n, os.path.abspath(__file__),
                                                ["--worker", "memory", "--stage", stage, *common], args.timeout,
                                                mpirun=args.mpirun)
    timing = run_mpi_worker(venv, 2, os.path.abspath(__file__),
                            ["--worker", "time", "--rounds", args.rounds, "--steps", args.steps, *common], args.timeout,
                            mpirun=args.mpirun)
    loads_after = load_average()
    params = next(iter(memory.values()))["params"]
    print(f"# zero_bench: {params / 1e6:.1f}M-parameter MLP, Adam, batch {args.batch}, {args.device}, "
          f"1 torch thread per rank")
    print(f"# {describe_machine()}; {utc_now()}")
    print(f"# before: {describe_load(loads_before)}; after: {describe_load(loads_after)}")
    print(table(memory, timing, args.rounds, args.steps, args.device))
    if args.plot:
        plot(memory, args.plot, [f"{describe_machine()}; measured {utc_now()}",
                                 f"{params / 1e6:.1f}M-parameter MLP, Adam, fp32; benchmarks/zero_bench.py; "
                                 f"{describe_load(loads_after)}"])
        print(f"# plot: {args.plot}")


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--worker", choices=["memory", "time"])
    p.add_argument("--stage", type=int, default=0)
    p.add_argument("--params", type=float, default=25e6)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--ranks", type=int, nargs="+", default=[1, 2, 3])
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    p.add_argument("--timeout", type=float, default=900)
    p.add_argument("--mpirun", help="the MPI launcher (default: the one beside this Python)")
    p.add_argument("--plot")
    p.add_argument("--json")
    args = p.parse_args()
    worker(args) if args.worker else driver(args)


if __name__ == "__main__":
    main()
