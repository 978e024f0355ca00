"""What the sharded optimizer (zero_optimizer.py) refuses. Construction is collective: the ranks
share their refusals and parameter layouts with one allgather (collectives/zero_agreement.py), so
a refusal on any rank, or layouts that differ, raise on every rank.
"""
import torch

from collectives import zero_arguments

# Optimizers whose update of each element depends only on that element's gradient, state and
# scalars (the step count, the learning rate): they step a flat shard exactly as they step the
# whole tensors. Subclasses are taken as the same kind (they rarely change the update's shape).
ELEMENTWISE = tuple(getattr(torch.optim, name) for name in (
    "SGD", "Adam", "AdamW", "Adagrad", "RMSprop", "Adamax", "NAdam", "RAdam", "Adadelta", "ASGD", "Rprop")
    if hasattr(torch.optim, name))


def check_arguments(optimizer, zero_stage, op, gradient_predivide_factor, backward_passes_per_step, num_groups,
                    groups):
    """Raises on this rank what cannot be sharded (the caller shares the refusal with the others)."""
    zero_arguments.check_arguments(zero_stage, op, gradient_predivide_factor, backward_passes_per_step,
                                   groups is not None or bool(num_groups))
    if not isinstance(optimizer, ELEMENTWISE):
        zero_arguments.refuse_not_elementwise(zero_stage, type(optimizer), [cls.__name__ for cls in ELEMENTWISE],
                                              "parameters")