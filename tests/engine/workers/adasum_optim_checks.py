"""torch DistributedOptimizer(op=Adasum) against a numpy re-implementation of Horovod's delta
optimizer (imported by adasum_worker.py for its ``optim`` family).

The model is a linear regression (W: 2x3, b: 2) in float64. Every rank recomputes every rank's
batch from the same seeds, so the reference simulates the whole job in numpy: each rank's
optimizer (with its own local state) steps from the shared parameters on its own gradient,
and the parameters move by the Adasum over ranks of those steps, tensor by tensor.
"""
import numpy as np
import torch

import collectives as hvd
import collectives.torch as thvd
from adasum_reference import adasum, assert_close

torch.set_num_threads(1)
R, S = hvd.rank(), hvd.size()
W0 = np.array([[0.5, -0.2, 0.1], [0.3, 0.8, -0.6]])
B0 = np.array([0.05, -0.1])


def batch(step, rank, n=4):
    rng = np.random.default_rng([17, step, rank])
    return rng.standard_normal((n, 3)), rng.standard_normal((n, 2))


def grads(w, b, x, y):
    """Gradients of torch's mse_loss (mean over every element) of x @ w.T + b against y."""
    err = x @ w.T + b - y
    scale = 2.0 / err.size
    return scale * err.T @ x, scale * err.sum(axis=0)


def make_model():
    w = torch.nn.Parameter(torch.tensor(W0))
    b = torch.nn.Parameter(torch.tensor(B0))
    return w, b


def backward(w, b, step):
    x, y = (torch.from_numpy(a) for a in batch(step, R))
    torch.nn.functional.mse_loss(x @ w.T + b, y).backward()


def sgd_momentum_reference(steps, lr, momentum):
    w, b = W0.copy(), B0.copy()
    bufs = [[None, None] for _ in range(S)]  # per rank: its own momentum buffers
    for step in range(steps):
        deltas = [[], []]
        for r in range(S):
            for k, g in enumerate(grads(w, b, *batch(step, r))):
                bufs[r][k] = g.copy() if bufs[r][k] is None else momentum * bufs[r][k] + g
                deltas[k].append(-lr * bufs[r][k])
        w, b = w + adasum(deltas[0]), b + adasum(deltas[1])
    return w, b


def adam_reference(steps, lr, beta1=0.9, beta2=0.999, eps=1e-8):
    w, b = W0.copy(), B0.copy()
    moments = [[[0.0, 0.0], [0.0, 0.0]] for _ in range(S)]  # per rank, per tensor: (m, v)
    for step in range(steps):
        t = step + 1
        deltas = [[], []]
        for r in range(S):
            for k, g in enumerate(grads(w, b, *batch(step, r))):
                m, v = moments[r][k]
                m = beta1 * m + (1 - beta1) * g
                v = beta2 * v + (1 - beta2) * g * g
                moments[r][k] = [m, v]
                denom = np.sqrt(v) / np.sqrt(1 - beta2 ** t) + eps
                deltas[k].append(-(lr / (1 - beta1 ** t)) * m / denom)
        w, b = w + adasum(deltas[0]), b + adasum(deltas[1])
    return w, b


def train(opt_factory, steps, passes=1):
    w, b = make_model()
    opt = thvd.DistributedOptimizer(opt_factory([w, b]), named_parameters=[("W", w), ("b", b)], op=thvd.Adasum,
                                    backward_passes_per_step=passes)
    for step in range(steps):
        opt.zero_grad()
        for k in range(passes):
            backward(w, b, passes * step + k)
            if k < passes - 1:
                try:  # Horovod: gradients still accumulating count as pending
                    opt.zero_grad()
                except AssertionError:
                    pass
                else:
                    raise AssertionError("zero_grad between accumulated passes did not raise")
        opt.step()
    return w.detach().numpy(), b.detach().numpy()


def sgd_momentum():
    got = train(lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.9), 3)
    for g, want, name in zip(got, sgd_momentum_reference(3, 0.1, 0.9), "Wb"):
        assert_close(g, want, 1e-12, f"SGD momentum {name}")


def adam():
    got = train(lambda ps: torch.optim.Adam(ps, lr=0.05), 3)
    for g, want, name in zip(got, adam_reference(3, 0.05), "Wb"):
        assert_close(g, want, 1e-10, f"Adam {name}")


def accumulated_passes():
    """backward_passes_per_step=2: the step uses the sum of both passes' gradients."""
    got = train(lambda ps: torch.optim.SGD(ps, lr=0.1), 2, passes=2)
    w, b = W0.copy(), B0.copy()
    for step in range(2):
        deltas = [[], []]
        for r in range(S):
            g1, g2 = grads(w, b, *batch(2 * step, r)), grads(w, b, *batch(2 * step + 1, r))
            for k in range(2):
                deltas[k].append(-0.1 * (g1[k] + g2[k]))
        w, b = w + adasum(deltas[0]), b + adasum(deltas[1])
    for g, want, name in zip(got, (w, b), "Wb"):
        assert_close(g, want, 1e-12, f"2 passes {name}")


def horovod_surface():
    """skip_synchronize raises, synchronize is a no-op, a process set is refused, and
    broadcast_optimizer_state works on the delta optimizer (every rank ends with rank 0's state)."""
    w, b = make_model()
    opt = thvd.DistributedOptimizer(torch.optim.Adam([w, b], lr=0.01), op=thvd.Adasum)
    opt.synchronize()
    try:
        with opt.skip_synchronize():
            pass
    except AssertionError:
        pass
    else:
        raise AssertionError("skip_synchronize did not raise")
    thvd.broadcast_optimizer_state(opt, root_rank=0)
    steps = hvd.allgather_object([float(opt.state[p]["step"]) for p in (w, b)])
    assert all(s == steps[0] for s in steps), steps
    if S > 2:
        ps = hvd.add_process_set([0, 1])
        try:
            if R in (0, 1):
                w2, b2 = make_model()
                try:
                    thvd.DistributedOptimizer(torch.optim.SGD([w2, b2], lr=0.1), op=thvd.Adasum, process_set=ps)
                except NotImplementedError as e:
                    assert "process sets" in str(e), e
                else:
                    raise AssertionError("a process set was accepted")
        finally:
            hvd.remove_process_set(ps)


CHECKS = [("optimizer SGD momentum", sgd_momentum), ("optimizer Adam", adam),
          ("optimizer backward_passes_per_step=2", accumulated_passes), ("optimizer Horovod surface", horovod_surface)]
