"""What the sharded optimizer (zero_optimizer.py) refuses. Construction is collective: the ranks
share their refusals and parameter layouts with one allgather (collectives/zero_agreement.py), so
a refusal on any rank, or layouts that differ, raise on every rank.
"""
import torch

from collectives.constants import Adasum, Average
from collectives.errors import InvalidArgumentError, NotSupportedError

# Optimizers whose update of each element depends only on that element's gradient, state and
# scalars (the step count, the learning rate): they step a flat shard exactly as they step the
# whole tensors. Subclasses are taken as the same kind (they rarely change the update's shape).
ELEMENTWISE = tuple(getattr(torch.optim, name) for name in (
    "SGD", "Adam", "AdamW", "Adagrad", "RMSprop", "Adamax", "NAdam", "RAdam", "Adadelta", "ASGD", "Rprop")
    if hasattr(torch.optim, name))


def check_arguments(optimizer, zero_stage, op, gradient_predivide_factor, backward_passes_per_step, num_groups,
                    groups):
    """Raises on this rank what cannot be sharded (the caller shares the refusal with the others)."""
    if isinstance(zero_stage, bool) or zero_stage not in (1, 2):
        raise InvalidArgumentError(f"zero_stage must be 0 (no sharding), 1 (optimizer state sharded) or 2 "
                                   f"(gradients too), not {zero_stage!r}")
    if not isinstance(optimizer, ELEMENTWISE):
        names = ", ".join(cls.__name__ for cls in ELEMENTWISE)
        raise NotSupportedError(
            f"zero_stage={zero_stage}: {type(optimizer).__name__} cannot step on a shard of the parameters (its "
            f"update needs whole tensors, or it is not known to be elementwise); supported: {names} and their "
            f"subclasses. Use zero_stage=0 for it.")
    if op == Adasum:
        raise NotSupportedError(f"zero_stage={zero_stage} cannot be combined with op=Adasum (Adasum combines "
                                f"whole optimizer steps, not gradient shards); use op=Average or op=Sum")
    if gradient_predivide_factor != 1.0 and op != Average:
        raise ValueError("gradient_predivide_factor not supported with op != Average")
    if backward_passes_per_step < 1:
        raise ValueError("backward_passes_per_step must be >= 1")
    if groups is not None or num_groups:
        raise InvalidArgumentError(f"zero_stage={zero_stage}: groups/num_groups do not apply (gradients travel "
                                   f"in flat buckets); leave them unset")
