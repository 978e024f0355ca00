"""What the sharded optimizer (zero_optimizer.py) refuses, and how the ranks agree at construction.

Construction is collective: every rank of the process set builds its optimizer, and they exchange
one small object (this rank's refusal, if any, and the parameter layout's signature) with one
allgather. A refusal on any rank, or layouts that differ, then raise on every rank: a rank that
refused alone would otherwise leave the others waiting for reducescatters it never starts.
"""
import torch

from collectives import objects
from collectives.constants import Adasum, Average
from collectives.errors import InvalidArgumentError, NotSupportedError, TensorMismatchError

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


def _describe(entry):
    g, shape, dtype, requires_grad = entry
    return f"group {g}, shape {list(shape)}, {dtype}{'' if requires_grad else ', frozen'}"


def _difference(first, theirs, rank):
    """The first difference between rank 0's parameter signature and ``rank``'s, in words."""
    if len(first) != len(theirs):
        return f"{len(theirs)} parameters on rank {rank}, {len(first)} on rank 0"
    for i, (a, b) in enumerate(zip(first, theirs)):
        if a != b:
            return f"parameter {i} is ({_describe(b)}) on rank {rank}, ({_describe(a)}) on rank 0"
    return "different buckets"


def agree(problem, signature, process_set, stage):
    """One allgather of (refusal, signature) over the set; raises the same on every rank."""
    mine = None if problem is None else (type(problem), str(problem))
    everyone = objects.allgather_object((mine, signature), name="zero_optimizer.layout", process_set=process_set)
    for rank, (refusal, _) in enumerate(everyone):
        if refusal is None:
            continue
        if problem is not None:
            raise problem
        cls, message = refusal
        try:
            error = cls(f"rank {rank} of the process set refused zero_stage={stage}: {message}")
        except Exception:  # noqa: BLE001 - an exception class with another constructor: keep the message
            error = InvalidArgumentError(f"rank {rank} of the process set refused zero_stage={stage}: {message}")
        raise error
    first = everyone[0][1]
    for rank, (_, theirs) in enumerate(everyone):
        if theirs != first:
            raise TensorMismatchError(
                f"zero_stage={stage}: the ranks' optimizers hold different parameters (every rank must wrap the "
                f"same model's parameters in the same order): {_difference(first[0], theirs[0], rank)}")
