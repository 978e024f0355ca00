"""The ``overlap`` family of torch_optim_worker.py: when DistributedOptimizer starts its
allreduces (adapters/torch/optimizer.py).

- A model with at least ``COLLECTIVES_OVERLAP_MIN_BYTES`` of gradients (here: the knob set to
  0) starts each allreduce during the backward pass, as soon as the gradient is final.
- A smaller model (the default 1 MiB) starts nothing during backward and one grouped
  allreduce in step(); its averaged gradients equal numpy's average of every rank's gradients,
  with parameters of two dtypes and an unused one, and over backward_passes_per_step=2.
- GPU parameters, user groups and the knob's value decide as documented.
"""
import os
from unittest import mock

import numpy as np
import torch

import collectives as hvd
from collectives.torch.optimizer import DistributedOptimizer

KNOB = "COLLECTIVES_OVERLAP_MIN_BYTES"


def overlap_min_bytes(value):
    """The knob, read when the optimizer is made, set for a ``with`` block."""
    return mock.patch.dict(os.environ, {KNOB: str(value)})


def six_layers():
    torch.manual_seed(0)
    return torch.nn.Sequential(*[torch.nn.Linear(32, 32) for _ in range(6)])  # 12 tensors, 25 KB


def submissions_during_backward(opt, model, x):
    """(submitted before the first layer's input gradient existed, submitted by the end of
    backward), counted from the step's start."""
    seen = []
    h = model[0](x)
    # Fires when the gradient w.r.t. the first layer's output is computed: the later layers'
    # gradients are final by then, the first layer's are not.
    h.register_hook(lambda g: seen.append(opt._submissions) or None)
    out = model[1:](h)
    before = opt._submissions
    out.sum().backward()
    return seen[-1] - before, opt._submissions - before


def started_in_backward():
    model = six_layers()
    with overlap_min_bytes(0):
        opt = DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.01),
                                   named_parameters=model.named_parameters())
    assert not opt._deferred
    for _ in range(3):
        early, by_end = submissions_during_backward(opt, model, torch.randn(8, 32))
        assert early > 0, "nothing submitted before the end of backward"
        assert early < 12, "everything submitted before the first layer's gradient existed"
        assert by_end == 12, by_end
        opt.step()
        opt.zero_grad()


def started_in_step():
    model = six_layers()
    opt = DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.01), named_parameters=model.named_parameters())
    assert opt._deferred, "a 25 KB model under the default 1 MiB should be reduced in step()"
    for _ in range(3):
        early, by_end = submissions_during_backward(opt, model, torch.randn(8, 32))
        assert (early, by_end) == (0, 0), (early, by_end)
        before = opt._submissions
        opt.step()
        assert opt._submissions - before == 1, "expected one grouped allreduce in step()"
        opt.zero_grad()


class TwoDtypes(torch.nn.Module):
    """A float32 and a float64 layer, and a layer that takes part only where ``use_extra``."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(1)
        self.a = torch.nn.Linear(6, 5)
        self.b = torch.nn.Linear(5, 2).double()
        self.extra = torch.nn.Linear(6, 2).double()

    def forward(self, x, use_extra):
        out = self.b(torch.tanh(self.a(x)).double())
        return out + self.extra(x.double()) if use_extra else out


def deferred_gradients_match_numpy(passes):
    model = TwoDtypes()
    opt = DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.0), named_parameters=model.named_parameters(),
                               backward_passes_per_step=passes)
    assert opt._deferred
    rank = hvd.rank()
    for step in range(2):
        opt.zero_grad()
        for j in range(passes):
            g = torch.Generator().manual_seed(100 * step + 10 * j + rank)
            # The extra layer takes part on rank 0 only: elsewhere its gradient is zeros.
            model(torch.randn(4, 6, generator=g), use_extra=rank == 0).sum().backward()
        local = [np.zeros(p.shape, dtype=torch.empty(0, dtype=p.dtype).numpy().dtype) if p.grad is None
                 else p.grad.detach().numpy().copy() for p in model.parameters()]
        everyone = hvd.allgather_object(local)
        opt.synchronize()
        for i, p in enumerate(model.parameters()):
            expected = np.mean([theirs[i] for theirs in everyone], axis=0)
            assert p.grad.dtype == p.dtype, (i, p.grad.dtype, p.dtype)
            np.testing.assert_allclose(p.grad.numpy(), expected, rtol=1e-6, atol=1e-7, err_msg=f"parameter {i}")
        with opt.skip_synchronize():
            opt.step()


def who_defers():
    def made(model, **kw):
        return DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.01),
                                    named_parameters=model.named_parameters(), **kw)
    assert made(six_layers())._deferred
    assert not made(six_layers(), groups=2)._deferred, "user groups say how to fuse"
    with overlap_min_bytes(25344):  # six 32 x 32 weights and six 32 biases, float32: 25,344 bytes
        assert not made(six_layers())._deferred
    with overlap_min_bytes(25345):
        assert made(six_layers())._deferred


def family_overlap(chk):
    chk.check("allreduces started during backward (COLLECTIVES_OVERLAP_MIN_BYTES=0)", started_in_backward)
    chk.check("a small model's allreduce started in step(), once", started_in_step)
    chk.check("deferred gradients match numpy (two dtypes, an unused layer)",
              lambda: deferred_gradients_match_numpy(1))
    chk.check("deferred gradients match numpy, backward_passes_per_step=2",
              lambda: deferred_gradients_match_numpy(2))
    chk.check("which optimizers defer", who_defers)
