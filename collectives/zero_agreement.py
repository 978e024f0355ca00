"""How the ranks agree when a sharded (``zero_stage``) optimizer is set up, for every framework.

Setting one up is collective: each rank shares one small object with one allgather over the process
set (its refusal, if any, and a signature of the parameters it would shard). A refusal on any rank,
or signatures that differ, then raise on every rank: a rank that refused alone would otherwise
leave the others waiting for reducescatters it never starts.

A signature is ``(params, buckets)``: ``params`` lists ``(group, shape, dtype, requires_grad)`` per
parameter (the adapters' layouts make them), ``buckets`` whatever else must match.
"""
from collectives import objects
from collectives.errors import InvalidArgumentError, TensorMismatchError


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


def agree(problem, signature, process_set, stage, name="zero_optimizer.layout"):
    """One allgather of (refusal, signature) over the set; raises the same on every rank.
    ``signature`` None skips the comparison (a check of refusals only)."""
    mine = None if problem is None else (type(problem), str(problem))
    everyone = objects.allgather_object((mine, signature), name=name, process_set=process_set)
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
