"""torch AMP's ``GradScaler`` with the sharded optimizer (zero_optimizer.py).

``scaler.step(optimizer)`` normally unscales ``p.grad`` and checks it for infs before calling
``optimizer.step()``. With sharded gradients that check would read the wrong thing: the local,
unreduced ``p.grad`` at stage 1 (an inf on one rank only: the ranks would disagree, one stepping
and the others not) and nothing at all at stage 2 (``p.grad`` is released). So the sharded
optimizer takes the scaler's other protocol (torch 2.13, ``GradScaler.step``): it sets
``_step_supports_amp_scaling`` and its ``step()`` takes a ``grad_scaler`` keyword, so the scaler
checks nothing itself and passes itself in. ``step()`` then, after the reducescatters:

1. unscales the REDUCED shard gradients by ``1 / scale`` and notes any inf/NaN in them, as the
   scaler's own unscale does (``torch._amp_foreach_non_finite_check_and_unscale_``, per device and
   dtype, the inverse computed in float64 as torch does);
2. agrees on the flag with one allreduce of one number (MAX over the process set), so every rank
   skips the step or none does;
3. records the agreed flag in the scaler's per-optimizer state, where ``scaler.update()`` reads it:
   every rank's scale then backs off (or grows) alike.

torch warns (FutureWarning, once per call site) that it will stop passing itself as the keyword;
if it then sets ``grad_scale``/``found_inf`` attributes instead, step() refuses (those come from
the local gradients) rather than step wrongly.
"""
from collections import defaultdict

import torch

from collectives.constants import Max
from collectives.errors import NotSupportedError

from . import ops as raw


def _scaler_state(optimizer, scaler):
    states = getattr(scaler, "_per_optimizer_states", None)
    scale = getattr(scaler, "_scale", None)
    if states is None or scale is None:
        raise NotSupportedError(f"zero_stage={optimizer.zero_stage}: this GradScaler ({type(scaler).__name__}) does "
                                "not keep torch 2.13's per-optimizer state; the sharded optimizer cannot record its "
                                "inf check there")
    return states[id(optimizer)], scale


def refuse_unscaled(optimizer, scaler):
    """``scaler.unscale_(optimizer)`` before ``step()`` unscaled and checked the local, unreduced
    ``p.grad`` (nothing at stage 2), not what the shards step with: refused on every rank (every
    rank runs the same scaler calls)."""
    state, _ = _scaler_state(optimizer, scaler)
    stage = state.get("stage")
    if getattr(stage, "name", None) == "UNSCALED":
        raise NotSupportedError(
            f"zero_stage={optimizer.zero_stage}: scaler.unscale_(optimizer) reads the local, unreduced p.grad, not "
            f"the reduced gradient shards; let scaler.step(optimizer) unscale them. To clip, call "
            f"optimizer.clip_grad_norm_(max_norm * scaler.get_scale()) and then scaler.step(optimizer) inside "
            f"optimizer.skip_synchronize()")


@torch.no_grad()
def unscale_shards(optimizer, scaler):
    """Unscale the reduced shard gradients (``optimizer.synchronize()`` done), agree on inf/NaN
    over the ranks and record it for ``scaler.update()``. True: every rank skips this step."""
    state, scale = _scaler_state(optimizer, scaler)
    inv_scale = scale.double().reciprocal().float()
    found = torch.zeros((), dtype=torch.float32, device=scale.device)
    grouped = defaultdict(list)
    for shard in optimizer._shards:
        if shard.grad is not None:
            grouped[(shard.grad.device, shard.grad.dtype)].append(shard.grad)
    for (device, _), grads in grouped.items():
        found_here = torch.zeros((), dtype=torch.float32, device=device)
        torch._amp_foreach_non_finite_check_and_unscale_(grads, found_here, inv_scale.to(device))
        found = torch.maximum(found, found_here.to(scale.device))
    if optimizer._communicates:
        found = raw.allreduce(found.reshape(1), Max, "zero_optimizer.found_inf",
                              process_set=optimizer.process_set).reshape(())
    state["found_inf_per_device"] = {found.device: found}
    return bool(found.item())
