"""Horovod's PyTorch synthetic benchmark on collectives: training throughput of a ResNet on
random images, in images per second per rank and in total.

    .venv/bin/mpirun -np 2 .venv/bin/python examples/pytorch_synthetic_benchmark.py [--model resnet18]
        [--batch-size 32] [--image-size 64] [--num-warmup-batches 10] [--num-batches-per-iter 10]
        [--num-iters 10] [--fp16-allreduce] [--no-distributed-optimizer | --ddp]

Three ways to train, one per run:
  default                     collectives: broadcast_parameters / broadcast_optimizer_state from
                              rank 0, then hvd.DistributedOptimizer averages the gradients
  --no-distributed-optimizer  the plain optimizer, no communication at all: each rank trains
                              alone (the upper bound on throughput; the baseline)
  --ddp                       torch.nn.parallel.DistributedDataParallel on gloo, for comparison

The models are torchvision's ResNet layouts (BasicBlock: resnet10/18/34; the same parameter
shapes, so the same gradient volume: 11.7M parameters for resnet18), written out here because
torchvision is not a dependency. Images are 3 x 64 x 64 by default instead of Horovod's 224:
the gradients to exchange are as large, the compute per image ~12x smaller, so CPU runs stay
short. Printed figures follow Horovod: per-iteration rates, then mean +- 1.96 standard deviations.
benchmarks/torch_training_bench.py runs all three modes in one launch and compares them.
"""
import argparse
import inspect
import os
import socket
import time

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

import collectives.torch as hvd

MODES = {
    "collectives": "collectives DistributedOptimizer",
    "none": "no distributed optimizer (no communication)",
    "ddp": "torch DistributedDataParallel on gloo",
}


# ---------------------------------------------------------------- model (torchvision's ResNet layout)

class BasicBlock(nn.Module):
    def __init__(self, in_channels, channels, stride, norm_layer):
        super().__init__()
        self.conv1 = nn.Conv2d(in_channels, channels, 3, stride, 1, bias=False)
        self.bn1 = norm_layer(channels)
        self.conv2 = nn.Conv2d(channels, channels, 3, 1, 1, bias=False)
        self.bn2 = norm_layer(channels)
        self.downsample = None
        if stride != 1 or in_channels != channels:  # the shortcut must match the new shape
            self.downsample = nn.Sequential(nn.Conv2d(in_channels, channels, 1, stride, bias=False),
                                            norm_layer(channels))

    def forward(self, x):
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return F.relu(out + (x if self.downsample is None else self.downsample(x)))


class ResNet(nn.Module):
    def __init__(self, blocks_per_stage, num_classes=1000, norm_layer=nn.BatchNorm2d):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 64, 7, 2, 3, bias=False)
        self.bn1 = norm_layer(64)
        stages, in_channels = [], 64
        for i, (channels, blocks) in enumerate(zip((64, 128, 256, 512), blocks_per_stage)):
            for b in range(blocks):
                stages.append(BasicBlock(in_channels, channels, 2 if b == 0 and i > 0 else 1, norm_layer))
                in_channels = channels
        self.layers = nn.Sequential(*stages)
        self.fc = nn.Linear(512, num_classes)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.bn1(self.conv1(x))), 3, 2, 1)
        x = self.layers(x)
        return self.fc(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1))


MODELS = {"resnet10": (1, 1, 1, 1), "resnet18": (2, 2, 2, 2), "resnet34": (3, 4, 6, 3)}


def build_model(name, norm_layer=nn.BatchNorm2d):
    torch.manual_seed(0)
    return ResNet(MODELS[name], norm_layer=norm_layer)


# ---------------------------------------------------------------- the three ways to train

def init_gloo():
    """torch.distributed on gloo for DDP, rendezvous at rank 0 on a port rank 0 picked (once)."""
    import torch.distributed as dist

    if dist.is_initialized():
        return
    port = None
    if hvd.rank() == 0:
        with socket.socket() as s:  # a free port now; taken back by gloo a moment later
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(hvd.broadcast_object(port, root_rank=0, name="benchmark.gloo_port"))
    if len(set(hvd.allgather_object(socket.gethostname(), name="benchmark.hosts"))) > 1:
        raise SystemExit("--ddp here rendezvouses on 127.0.0.1: run all ranks on one machine")
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    dist.init_process_group("gloo", rank=hvd.rank(), world_size=hvd.size())


def no_buffer_sync_per_step():
    """DDP's argument for not broadcasting buffers (BatchNorm running statistics) every step:
    the other modes exchange gradients only, and so does DDP here. torch 2.13 renamed
    broadcast_buffers to forward_sync_buffers."""
    parameters = inspect.signature(nn.parallel.DistributedDataParallel.__init__).parameters
    return {"forward_sync_buffers": False} if "forward_sync_buffers" in parameters else {"broadcast_buffers": False}


def make_training_step(mode, model_name="resnet18", batch_size=32, image_size=64, fp16_allreduce=False,
                       sync_batch_norm=False):
    """A fresh model, optimizer and synthetic batch; returns ``step()``, one training step."""
    norm_layer = hvd.SyncBatchNorm if sync_batch_norm else nn.BatchNorm2d
    model = build_model(model_name, norm_layer)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01 * hvd.size(), momentum=0.9)
    if mode == "collectives":
        hvd.broadcast_parameters(model.state_dict(), root_rank=0)
        hvd.broadcast_optimizer_state(optimizer, root_rank=0)
        compression = hvd.Compression.fp16 if fp16_allreduce else hvd.Compression.none
        optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters(),
                                             compression=compression)
    elif mode == "ddp":
        from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

        init_gloo()
        model = nn.parallel.DistributedDataParallel(model, **no_buffer_sync_per_step())
        if fp16_allreduce:
            model.register_comm_hook(None, default_hooks.fp16_compress_hook)
    elif mode != "none":
        raise ValueError(f"unknown mode {mode!r}")
    generator = torch.Generator().manual_seed(hvd.rank())
    data = torch.randn(batch_size, 3, image_size, image_size, generator=generator)
    target = torch.randint(0, 1000, (batch_size,), generator=generator)

    def step():
        optimizer.zero_grad()
        F.cross_entropy(model(data), target).backward()
        optimizer.step()

    return step


def time_batches(step, count):
    """Seconds for ``count`` training steps."""
    start = time.perf_counter()
    for _ in range(count):
        step()
    return time.perf_counter() - start


def all_ranks(values, name):
    """(ranks, len(values)) array of every rank's ``values`` (gathered outside timed regions)."""
    return np.array(hvd.allgather_object([float(v) for v in values], name=name))


def confidence(values):
    """Horovod's +- figure: 1.96 standard deviations."""
    return 1.96 * float(np.std(values))


# ---------------------------------------------------------------- main

def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--model", default="resnet18", choices=sorted(MODELS))
    parser.add_argument("--batch-size", type=int, default=32, help="images per rank per step")
    parser.add_argument("--image-size", type=int, default=64, help="images are 3 x SIZE x SIZE")
    parser.add_argument("--num-warmup-batches", type=int, default=10)
    parser.add_argument("--num-batches-per-iter", type=int, default=10)
    parser.add_argument("--num-iters", type=int, default=10)
    parser.add_argument("--fp16-allreduce", action="store_true", help="gradients travel as float16")
    parser.add_argument("--sync-batch-norm", action="store_true", help="hvd.SyncBatchNorm (collectives mode only)")
    parser.add_argument("--num-threads", type=int, default=0,
                        help="torch threads per rank; 0: cores / ranks on this machine (at least 1)")
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--no-distributed-optimizer", action="store_true",
                       help="plain optimizer, no communication (the baseline)")
    group.add_argument("--ddp", action="store_true", help="torch DistributedDataParallel on gloo")
    args = parser.parse_args(argv)
    if args.sync_batch_norm and (args.ddp or args.no_distributed_optimizer):
        parser.error("--sync-batch-norm needs the collectives mode (torch's SyncBatchNorm needs a GPU; "
                     "--no-distributed-optimizer means no communication)")
    return args


def set_threads(requested):
    # Ranks share the machine's cores: more compute threads than cores makes every rank slower.
    threads = requested or max(1, (os.cpu_count() or 1) // hvd.local_size())
    torch.set_num_threads(threads)
    return threads


def main():
    args = parse_args()
    hvd.init()
    threads = set_threads(args.num_threads)
    mode = "ddp" if args.ddp else "none" if args.no_distributed_optimizer else "collectives"

    def log(line):
        if hvd.rank() == 0:
            print(line, flush=True)

    log(f"Model: {args.model}")
    log(f"Batch size: {args.batch_size}")
    log(f"Image size: 3x{args.image_size}x{args.image_size}")
    log(f"Number of ranks: {hvd.size()}")
    log(f"Mode: {MODES[mode]}" + (", fp16 allreduce" if args.fp16_allreduce and mode != "none" else "")
        + (", SyncBatchNorm" if args.sync_batch_norm else ""))
    log(f"Torch threads per rank: {threads}")

    step = make_training_step(mode, args.model, args.batch_size, args.image_size, args.fp16_allreduce,
                              args.sync_batch_norm)
    log("Running warmup...")
    time_batches(step, args.num_warmup_batches)
    log("Running benchmark...")
    rates = []
    for i in range(args.num_iters):
        rate = args.batch_size * args.num_batches_per_iter / time_batches(step, args.num_batches_per_iter)
        log(f"Iter #{i}: {rate:.1f} img/sec per rank")
        rates.append(rate)

    every = all_ranks(rates, "benchmark.rates")  # (ranks, iterations)
    per_rank, total = every.mean(axis=0), every.sum(axis=0)  # per iteration
    log(f"Img/sec per rank: {per_rank.mean():.1f} +-{confidence(per_rank):.1f}")
    log(f"Total img/sec on {hvd.size()} ranks: {total.mean():.1f} +-{confidence(total):.1f}")
    if mode == "ddp":
        torch.distributed.destroy_process_group()
    hvd.shutdown()


if __name__ == "__main__":
    main()
