"""gpu_worker.py's optimizer family: DistributedOptimizer on the rank's device (CUDA, or CPU
with GPU_TEST_DEVICE=cpu). N ranks on N slices of a batch must reach the parameters of one
process on the whole batch (SGD-momentum, Adam, groups, backward_passes_per_step, predivide,
fp16/bf16 compression, half-precision parameters); broadcast_parameters and
broadcast_optimizer_state must leave every rank with rank 0's state, on the device.

family_zero: the same with zero_stage=1 and 2 (reducescatter and allgather through NCCL on a
GPU): the parameters of one process, the shards and their state on the device, and a GradScaler
(on the device's type) whose skip is agreed over the ranks."""
import numpy as np
import torch

import collectives.torch as hvd


def _host(t):
    return t.detach().to("cpu").to(torch.float64 if t.dtype.is_floating_point else t.dtype).numpy()


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a = torch.nn.Linear(12, 16)
        self.b = torch.nn.Linear(16, 4)

    def forward(self, x):
        return self.b(torch.tanh(self.a(x)))


def _train(dev, rank, size, make_opt, dtype, steps=4, per_rank=6, bpps=1, distributed=None, tol=1e-10):
    torch.manual_seed(0)
    ref = Net().to(dtype).to(dev)
    mine = Net().to(dtype).to(dev)
    mine.load_state_dict(ref.state_dict())
    g = torch.Generator().manual_seed(1)
    data = [(torch.randn(size * per_rank * bpps, 12, generator=g).to(dtype).to(dev),
             torch.randn(size * per_rank * bpps, 4, generator=g).to(dtype).to(dev)) for _ in range(steps)]
    ref_opt = make_opt(ref.parameters())
    opt = hvd.DistributedOptimizer(make_opt(mine.parameters()), named_parameters=mine.named_parameters(),
                                   backward_passes_per_step=bpps, **(distributed or {}))
    for x, y in data:
        ref_opt.zero_grad()
        torch.nn.functional.mse_loss(ref(x), y).backward()
        ref_opt.step()
        opt.zero_grad()
        mine_x = x[rank * per_rank * bpps:(rank + 1) * per_rank * bpps]
        mine_y = y[rank * per_rank * bpps:(rank + 1) * per_rank * bpps]
        for k in range(bpps):  # each micro-batch's mean, averaged over passes and ranks = the full mean
            sl = slice(k * per_rank, (k + 1) * per_rank)
            (torch.nn.functional.mse_loss(mine(mine_x[sl]), mine_y[sl]) / bpps).backward()
        opt.step()
    for (name, p), q in zip(mine.named_parameters(), ref.parameters()):
        np.testing.assert_allclose(_host(p), _host(q), rtol=tol, atol=tol, err_msg=name)
        assert p.device.type == dev.type


def family_optimizer(chk, dev, rank, size):
    def train(*args, **kwargs):
        return lambda: _train(dev, rank, size, *args, **kwargs)

    sgd = lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.9)  # noqa: E731
    adam = lambda ps: torch.optim.Adam(ps, lr=0.01)  # noqa: E731
    chk.check("SGD-momentum, float64", train(sgd, torch.float64))
    chk.check("Adam, float64", train(adam, torch.float64))
    chk.check("groups=2", train(sgd, torch.float64, distributed={"groups": 2}))
    chk.check("backward_passes_per_step=2", train(sgd, torch.float64, bpps=2))
    chk.check("gradient_predivide_factor", train(sgd, torch.float64, distributed={"gradient_predivide_factor": 2.0}))
    for name, compression, tol in (("fp16", hvd.Compression.fp16, 2e-3), ("bf16", hvd.Compression.bf16, 3e-2)):
        chk.check(f"{name} compression", train(sgd, torch.float32, tol=tol, distributed={"compression": compression}))
    chk.check("float16 parameters", train(sgd, torch.float16, steps=2, tol=5e-3))
    chk.check("bfloat16 parameters", train(sgd, torch.bfloat16, steps=2, tol=3e-2))

    def broadcasts():
        torch.manual_seed(rank)  # different on every rank
        model = Net().to(dev)
        opt = torch.optim.Adam(model.parameters(), lr=0.01)
        if rank == 0:  # only the root has optimizer state
            model(torch.randn(2, 12, device=dev)).sum().backward()
            opt.step()
        hvd.broadcast_parameters(model.state_dict(), root_rank=0)
        hvd.broadcast_optimizer_state(opt, root_rank=0)
        flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
        gathered = hvd.allgather(flat.unsqueeze(0))
        assert torch.equal(gathered, flat.unsqueeze(0).expand(size, -1)), "parameters differ"
        for state in opt.state.values():
            for key, value in state.items():
                if isinstance(value, torch.Tensor) and value.dim() > 0:
                    assert value.device.type == dev.type, (key, value.device)
                    g = hvd.allgather(value.reshape(1, -1).float())
                    assert torch.equal(g, g[:1].expand_as(g)), key
    chk.check("broadcast_parameters and broadcast_optimizer_state (CUDA state)", broadcasts)


def family_zero(chk, dev, rank, size):
    def train(*args, **kwargs):
        return lambda: _train(dev, rank, size, *args, **kwargs)

    sgd = lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.9)  # noqa: E731
    adam = lambda ps: torch.optim.Adam(ps, lr=0.01)  # noqa: E731
    for stage in (1, 2):
        chk.check(f"zero_stage={stage} SGD-momentum, float64", train(sgd, torch.float64, distributed={"zero_stage": stage}))
        chk.check(f"zero_stage={stage} Adam, float64", train(adam, torch.float64, distributed={"zero_stage": stage}))
    chk.check("zero_stage=2 fp16 compression",
              train(sgd, torch.float32, tol=2e-3, distributed={"zero_stage": 2, "compression": hvd.Compression.fp16}))

    def shards_and_scaler():
        torch.manual_seed(0)
        model = Net().to(dev)
        opt = hvd.DistributedOptimizer(torch.optim.Adam(model.parameters(), lr=0.01), zero_stage=2)
        scaler = torch.amp.GradScaler(dev.type, init_scale=256.0)
        for step in range(2):
            opt.zero_grad()
            loss = model(torch.randn(4, 12, device=dev)).pow(2).mean()
            if step == 1 and rank == size - 1:
                loss = loss * float("inf")  # this rank alone: every rank must skip
            before = [p.detach().clone() for p in model.parameters()]
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
            moved = not all(torch.equal(a, b) for a, b in zip(before, model.parameters()))
            assert moved == (step == 0), (step, moved)
        assert scaler.get_scale() == 128.0, scaler.get_scale()
        for shard in opt._shards:
            assert shard.device.type == dev.type
            for value in opt._inner.state[shard].values():
                if isinstance(value, torch.Tensor) and value.dim():
                    assert value.device.type == dev.type and value.numel() == shard.numel()
    chk.check("zero_stage=2: shards and state on the device, GradScaler skip agreed", shards_and_scaler)
