"""Small torch models and their training step in several modes, for the benchmarks whose steps
must be short enough to repeat many times on a 2-core machine (benchmarks/plot_training.py,
benchmarks/busy_machine_bench.py):

  mlp   784-1024-1024-10, ReLU (1.86M parameters, 7.5 MB of float32 gradients), MNIST-sized input
  cnn   conv(1->32, 3x3)+pool, conv(32->64, 3x3)+pool, fc(1600->10) on 1x28x28 (34.8k parameters)

(the two models of issue 14's table, so the figures can be set beside it). Modes:
  collectives  hvd.DistributedOptimizer(named_parameters=...) after broadcasting rank 0's state
  none         the plain optimizer: no communication (the upper bound on throughput)
  ddp          torch DistributedDataParallel on gloo
a variant of ours (benchmarks/busy_machine_bench.py runs it on request):
  collectives_in_backward  the same with COLLECTIVES_OVERLAP_MIN_BYTES=0: every allreduce is
               started during backward, as Horovod does, also for a model under the default
               1 MiB of gradients (the CNN), which otherwise reduces them all in step()
and references (benchmarks/busy_machine_bench.py runs them):
  raw          raw mpi4py: one in-place Allreduce of all the gradients, flattened into one
               buffer after backward, then averaged (the raw-MPI row of issue 14's table)
  barrier      no communication but one raw mpi4py Barrier per step: what keeping the ranks in
               step costs with no data moved, waiting as MPICH does (polling on the core)
  gloo_barrier the same with torch.distributed's gloo barrier, whose wait blocks in the kernel
               (on its TCP socket) as DDP's does
"""
import os
import sys
from unittest import mock

import torch
import torch.nn as nn
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "examples"))

import collectives.torch as hvd  # noqa: E402
from pytorch_synthetic_benchmark import init_gloo  # noqa: E402  (gloo rendezvous on loopback)

MODES = ("collectives", "none", "ddp")
VARIANT_MODES = ("collectives_in_backward",)
REFERENCE_MODES = ("raw", "barrier", "gloo_barrier")
MODE_LABELS = {"collectives": "collectives DistributedOptimizer", "none": "no communication",
               "collectives_in_backward": "collectives, every allreduce started in backward",
               "ddp": "torch DDP (gloo)", "raw": "raw mpi4py allreduce after backward",
               "barrier": "no communication + an MPI barrier",
               "gloo_barrier": "no communication + a gloo barrier"}


class MLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1, self.fc2, self.fc3 = nn.Linear(784, 1024), nn.Linear(1024, 1024), nn.Linear(1024, 10)

    def forward(self, x):
        return self.fc3(F.relu(self.fc2(F.relu(self.fc1(x.flatten(1))))))


class CNN(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1, self.conv2 = nn.Conv2d(1, 32, 3), nn.Conv2d(32, 64, 3)
        self.fc = nn.Linear(1600, 10)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.conv1(x)), 2)
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        return self.fc(x.flatten(1))


MODELS = {"mlp": MLP, "cnn": CNN}
MODEL_LABELS = {"mlp": "MLP 784-1024-1024-10", "cnn": "CNN 2 conv + fc"}


def make_training_step(mode, model_name, batch_size=64):
    """A fresh model (same initial weights on every rank), optimizer and synthetic batch;
    returns ``step()``, one SGD step (forward, backward, update)."""
    torch.manual_seed(0)
    model = MODELS[model_name]()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    if mode in ("collectives", "collectives_in_backward"):
        hvd.broadcast_parameters(model.state_dict(), root_rank=0)
        # The knob is read when the optimizer is made.
        knob = {"COLLECTIVES_OVERLAP_MIN_BYTES": "0"} if mode == "collectives_in_backward" else {}
        with mock.patch.dict(os.environ, knob):
            optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters())
    elif mode == "ddp":
        init_gloo()
        model = nn.parallel.DistributedDataParallel(model)
    elif mode in REFERENCE_MODES:
        return _reference_step(mode, model, optimizer, *_batch(batch_size))
    elif mode != "none":
        raise ValueError(f"unknown mode {mode!r}; expected one of {MODES + VARIANT_MODES + REFERENCE_MODES}")
    data, target = _batch(batch_size)

    def step():
        optimizer.zero_grad()
        F.cross_entropy(model(data), target).backward()
        optimizer.step()

    return step


def start_benchmark(title, modes, model_name, batch_size=64, warmup_steps=5):
    """The common start of the benchmarks that time these steps: one torch thread per rank (as
    the peer kit and the tests run), ``hvd.init()``, a banner on rank 0, the load average, and
    each mode's step built and warmed up (a barrier before each, so ranks warm up together).
    Returns (rank0, load at the start, {mode: step})."""
    from machine_info import describe_machine, load_average, utc_now

    torch.set_num_threads(1)
    hvd.init()
    rank0 = hvd.rank() == 0
    if rank0:
        print(f"{title}: {describe_machine()}; {utc_now()}", flush=True)
    loads_start = load_average()
    steps = {}
    for mode in modes:
        steps[mode] = make_training_step(mode, model_name, batch_size)
        hvd.barrier()
        for _ in range(warmup_steps):
            steps[mode]()
    return rank0, loads_start, steps


def _batch(batch_size):
    """This rank's synthetic batch (different on every rank)."""
    generator = torch.Generator().manual_seed(hvd.rank())
    data = torch.randn(batch_size, 1, 28, 28, generator=generator)
    target = torch.randint(0, 10, (batch_size,), generator=generator)
    return data, target


def _reference_step(mode, model, optimizer, data, target):
    """The references: no engine; mpi4py's or gloo's calls made on the training thread."""
    from mpi4py import MPI
    import torch.distributed as dist

    if mode == "gloo_barrier":
        init_gloo()

    comm = MPI.COMM_WORLD
    params = [p for p in model.parameters()]
    flat = torch.zeros(sum(p.numel() for p in params))

    def step():
        optimizer.zero_grad()
        F.cross_entropy(model(data), target).backward()
        if mode == "raw":
            torch.cat([p.grad.reshape(-1) for p in params], out=flat)
            comm.Allreduce(MPI.IN_PLACE, flat.numpy(), op=MPI.SUM)
            flat.div_(comm.Get_size())
            offset = 0
            for p in params:
                p.grad.copy_(flat[offset:offset + p.numel()].view_as(p.grad))
                offset += p.numel()
        elif mode == "barrier":
            comm.Barrier()
        else:
            dist.barrier()
        optimizer.step()

    return step
