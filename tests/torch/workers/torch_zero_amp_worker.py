"""torch.amp.GradScaler with DistributedOptimizer(zero_stage=1/2) on real ranks (run under mpirun),
against the unsharded DistributedOptimizer with its own GradScaler on a copy of the same model and
data in the same process (Horovod's pattern: synchronize, unscale_, step inside skip_synchronize).

Usage: torch_zero_amp_worker.py

An inf is injected into one parameter's gradient on the last rank only, at one step: its local
gradients are the only ones with an inf, so a check of the local p.grad would have ranks disagree.
Every rank must skip that step (parameters unchanged, scale backed off alike), and after K steps
the parameters and scales equal the unsharded optimizer's.
"""

import torch

import collectives as hvd
import torch_zero_worker as base
from collectives.errors import NotSupportedError
from collectives.torch.optimizer import DistributedOptimizer
from common import Checker, raises

STEPS = 5
INF_STEP = 2
R = S = None
chk = None


def inject_inf(model, step):
    """On the last rank, at INF_STEP: an inf in c.weight's gradient (a tensor hook runs during
    backward, before the gradient reaches p.grad and the reducescatter)."""
    if step == INF_STEP and R == S - 1:
        return [model.c.weight.register_hook(lambda g: g * float("inf"))]
    return []


def loss_of(model, step):
    x, y = base.batch(step, R)
    return torch.nn.functional.mse_loss(model(x), y)


def scaler():
    return torch.amp.GradScaler("cpu", init_scale=1024.0, growth_interval=2)


def snapshot(model):
    return [p.detach().clone() for p in model.parameters()]


def unchanged(model, before):
    return all(torch.equal(a, b) for a, b in zip(before, model.parameters()))


def sharded_step(model, opt, sc, step):
    hooks = inject_inf(model, step)
    opt.zero_grad()
    sc.scale(loss_of(model, step)).backward()
    for h in hooks:
        h.remove()
    sc.step(opt)
    sc.update()


def reference_step(model, opt, sc, step):
    hooks = inject_inf(model, step)
    opt.zero_grad()
    sc.scale(loss_of(model, step)).backward()
    for h in hooks:
        h.remove()
    opt.synchronize()
    sc.unscale_(opt)
    with opt.skip_synchronize():
        sc.step(opt)
    sc.update()


def same_everywhere(value, what):
    values = hvd.allgather_object(value, name=f"amp.{what}")
    assert all(v == values[0] for v in values), f"{what} differs over the ranks: {values}"


def equal_to_unsharded(kind, stage):
    model, zopt, ref, ropt = base.pair(kind, stage)
    zscaler, rscaler = scaler(), scaler()
    skipped = []
    for step in range(STEPS):
        before = snapshot(model)
        sharded_step(model, zopt, zscaler, step)
        reference_step(ref, ropt, rscaler, step)
        skipped.append(unchanged(model, before))
        assert zscaler.get_scale() == rscaler.get_scale(), (step, zscaler.get_scale(), rscaler.get_scale())
        same_everywhere(zscaler.get_scale(), f"scale {kind} {stage} {step}")
    # every rank skipped the step with the inf (only the last rank's local gradient had one) and
    # no other step; the scale backed off there (1024 -> 2048 after 2 steps, then halved)
    assert skipped == [i == INF_STEP for i in range(STEPS)], skipped
    same_everywhere(skipped, f"skipped {kind} {stage}")
    assert zscaler.get_scale() == 2048.0, zscaler.get_scale()
    base.assert_same_params(model, ref, base.tolerance({}, kind), f"GradScaler {kind} stage {stage}")


def clipped(stage):
    """clip_grad_norm_(max_norm * scale) on the scaled shards, then scaler.step: the same as
    unscale_ + torch's clip_grad_norm_ on the reduced whole gradients (docs/zero.md)."""
    model, ref = base.Net(bf16=False), base.Net(bf16=False)  # bf16 would round the two orders apart
    zopt = DistributedOptimizer(torch.optim.Adam(base.groups(model), lr=0.01), zero_stage=stage)
    ropt = DistributedOptimizer(torch.optim.Adam(base.groups(ref), lr=0.01))
    zscaler, rscaler = scaler(), scaler()
    for step in range(3):
        zopt.zero_grad()
        zscaler.scale(loss_of(model, step)).backward()
        zopt.clip_grad_norm_(0.1 * zscaler.get_scale())
        with zopt.skip_synchronize():
            zscaler.step(zopt)
        zscaler.update()
        ropt.zero_grad()
        rscaler.scale(loss_of(ref, step)).backward()
        ropt.synchronize()
        rscaler.unscale_(ropt)
        torch.nn.utils.clip_grad_norm_(ref.parameters(), 0.1)
        with ropt.skip_synchronize():
            rscaler.step(ropt)
        rscaler.update()
    base.assert_same_params(model, ref, 1e-5, f"GradScaler clip stage {stage}", alone=S == 1)


def unscale_refused(stage):
    model = base.Net()
    before = snapshot(model)
    opt = DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), zero_stage=stage)
    sc = scaler()
    sc.scale(loss_of(model, 0)).backward()
    sc.unscale_(opt)
    raises(NotSupportedError, lambda: sc.step(opt), "scaler.unscale_(optimizer) reads the local, unreduced p.grad")
    assert unchanged(model, before), "stepped anyway"


def main():
    global R, S, chk
    hvd.init()
    R, S = hvd.rank(), hvd.size()
    base.R, base.S = R, S
    chk = Checker(R)
    for kind in ("adam", "sgd"):
        for stage in (1, 2):
            chk.check(f"GradScaler {kind} stage {stage} equals unsharded, inf on one rank skipped everywhere",
                      lambda: equal_to_unsharded(kind, stage))
    for stage in (1, 2):
        chk.check(f"GradScaler clip stage {stage}", lambda: clipped(stage))
        chk.check(f"GradScaler after unscale_ refused stage {stage}", lambda: unscale_refused(stage))
    # The refused steps leave their reducescatters (started during backward) unwaited: a rank that
    # reached shutdown() first would shut the engine down under a slower rank still submitting its
    # own (seen once in CI: ShutdownError in rank 1's backward). Meet before shutting down.
    hvd.barrier()
    hvd.shutdown()
    chk.finish()


if __name__ == "__main__":
    main()
