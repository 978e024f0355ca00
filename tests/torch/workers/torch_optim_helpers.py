"""Models, data and checks that torch_optim_worker.py's families share: a small MLP, a seeded
batch, and the equivalence of N ranks on 1/N of each batch with one process on the whole batch."""
import contextlib
import copy

import torch

import collectives as hvd
from collectives.torch.optimizer import DistributedOptimizer
from torch_optim_overlap import overlap_min_bytes


def mlp(seed=0, extra=False):
    torch.manual_seed(seed)
    layers = [torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 16), torch.nn.Tanh(),
              torch.nn.Linear(16, 3)]
    return torch.nn.Sequential(*layers)


def batch(step, n):
    g = torch.Generator().manual_seed(1000 + step)
    return torch.randn(n, 8, generator=g), torch.randn(n, 3, generator=g)


def loss_fn(model, x, y):
    return torch.nn.functional.mse_loss(model(x), y)


def assert_params_close(a, b, rtol, atol, what=""):
    for (name, p), q in zip(a.named_parameters(), b.parameters()):
        torch.testing.assert_close(p.detach(), q.detach(), rtol=rtol, atol=atol, msg=lambda m: f"{what} {name}: {m}")


def assert_same_on_all_ranks(model, what):
    mine = [p.detach().clone() for p in model.state_dict().values()]
    rootv = hvd.broadcast_object(mine, root_rank=0)
    for a, b in zip(mine, rootv):
        assert torch.equal(a, b), f"{what}: rank {hvd.rank()} differs from rank 0"


def run_equivalence(make_opt, steps=4, passes=1, rtol=1e-5, atol=1e-6, in_backward=False, **kw):
    """``in_backward``: start the allreduces during backward (COLLECTIVES_OVERLAP_MIN_BYTES=0);
    else this small model's are started in step() (torch_optim_overlap.py)."""
    micro = 4  # rows per rank per micro-batch
    R, S = hvd.rank(), hvd.size()
    model = mlp()
    ref = copy.deepcopy(model)
    ref_opt = make_opt(ref.parameters())
    with overlap_min_bytes(0) if in_backward else contextlib.nullcontext():
        opt = DistributedOptimizer(make_opt(model.parameters()), named_parameters=model.named_parameters(),
                                   backward_passes_per_step=passes, **kw)
    assert opt._deferred == (not in_backward and "groups" not in kw), opt._deferred
    for step in range(steps):
        x, y = batch(step, S * micro * passes)
        # reference: one process, micro-batch j is rows [j*S*micro, (j+1)*S*micro)
        ref_opt.zero_grad()
        for j in range(passes):
            rows = slice(j * S * micro, (j + 1) * S * micro)
            loss_fn(ref, x[rows], y[rows]).backward()
        ref_opt.step()
        # distributed: this rank's share of micro-batch j
        opt.zero_grad()
        for j in range(passes):
            rows = slice((j * S + R) * micro, (j * S + R + 1) * micro)
            loss_fn(model, x[rows], y[rows]).backward()
        opt.step()
    assert_params_close(model, ref, rtol, atol, "distributed vs single process")
    assert_same_on_all_ranks(model, "after training")
    assert opt._submissions > 0
    if opt._deferred:
        assert opt._submissions == steps, (opt._submissions, steps)  # one grouped allreduce per step
