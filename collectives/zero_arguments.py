"""The arguments a sharded (``zero_stage``) optimizer refuses whatever the framework, on this rank;
the adapters share the refusal with the other ranks (zero_agreement.py), so every rank raises it."""
from collectives.constants import Adasum, Average
from collectives.errors import InvalidArgumentError, NotSupportedError


def check_arguments(stage, op, gradient_predivide_factor, backward_passes_per_step, grouped):
    """``grouped``: the caller passed groups/num_groups, which flat buckets replace."""
    if isinstance(stage, bool) or stage not in (1, 2):
        raise InvalidArgumentError(f"zero_stage must be 0 (no sharding), 1 (optimizer state sharded) or 2 "
                                   f"(gradients too), not {stage!r}")
    if op == Adasum:
        raise NotSupportedError(f"zero_stage={stage} cannot be combined with op=Adasum (Adasum combines whole "
                                f"optimizer steps, not gradient shards); use op=Average or op=Sum")
    if gradient_predivide_factor != 1.0 and op != Average:
        raise ValueError("gradient_predivide_factor not supported with op != Average")
    if backward_passes_per_step < 1:
        raise ValueError("backward_passes_per_step must be >= 1")
    if grouped:
        raise InvalidArgumentError(f"zero_stage={stage}: groups/num_groups do not apply (gradients travel in flat "
                                   f"buckets); leave them unset")


def refuse_not_elementwise(stage, optimizer_class, supported, what):
    """NotSupportedError for an optimizer not known to update each element from that element alone
    (``what``: "parameters" or "variables", the framework's word)."""
    raise NotSupportedError(
        f"zero_stage={stage}: {optimizer_class.__name__} cannot step on a shard of the {what} (its update needs "
        f"whole tensors, or it is not known to be elementwise); supported: {', '.join(supported)} and their "
        f"subclasses. Use zero_stage=0 for it.")
