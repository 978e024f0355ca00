"""The flat bucket layout of the sharded optimizer (zero_optimizer.py): which parameters travel
together, where each one sits in its bucket and which contiguous slice of every bucket a rank owns.

Parameters that need a gradient are grouped by (param group, dtype, device), in reverse order of
the param groups (gradients arrive roughly in reverse), and cut into buckets of at most
``BUCKET_BYTES`` (a larger parameter gets a bucket of its own). A bucket's length is padded to a
multiple of ``ranks * ALIGN_BYTES / itemsize`` elements, so every rank owns exactly ``length / ranks``
elements starting at an aligned offset: even shards whatever the model (the core's reducescatter
gives the first ``length % ranks`` ranks an extra row; with padded lengths there is none). The
padding holds zeros: zero gradients, zero parameters, never written back to a parameter.

The layout depends only on the parameters, the groups and the number of ranks, so every rank
computes the same one; ``signature()`` is what the ranks compare at construction.
"""
from dataclasses import dataclass, field

import torch

from collectives import zero_layout

BUCKET_BYTES = 16 * 1024 * 1024  # MPICH copies a message above 32 MiB through fresh pages (NOTES.md)
ALIGN_BYTES = 64


@dataclass
class Slot:
    """One parameter's place in its bucket."""

    param: torch.Tensor
    index: int      # the parameter's position over all param groups (the state_dict's numbering)
    offset: int     # first element in the bucket
    numel: int


@dataclass
class Bucket:
    group: int                      # the param group its parameters belong to
    dtype: torch.dtype
    device: torch.device
    slots: list = field(default_factory=list)
    length: int = 0                 # padded: a multiple of ranks (and of the alignment)
    shard_start: int = 0            # this rank's slice: [shard_start, shard_start + shard_length)
    shard_length: int = 0

    def pieces(self):
        """(slot, first element in the parameter, first element in the shard, count) for each
        parameter overlapping this rank's shard."""
        return zero_layout.pieces(self.slots, self.shard_start, self.shard_start + self.shard_length)


def build_buckets(param_groups, ranks, rank, bucket_bytes=None):
    """The buckets of the parameters of ``param_groups`` (lists of tensors) that require a
    gradient, for ``rank`` of ``ranks``."""
    limit = BUCKET_BYTES if bucket_bytes is None else bucket_bytes
    indexed = []
    index = 0
    for g, params in enumerate(param_groups):
        for p in params:
            if p.requires_grad:
                indexed.append((g, index, p))
            index += 1
    open_buckets = {}  # (group, dtype, device) -> the bucket being filled
    buckets = []
    for g, i, p in reversed(indexed):
        key = (g, p.dtype, p.device)
        bucket = open_buckets.get(key)
        fill = bucket.slots[-1].offset + bucket.slots[-1].numel if bucket is not None else 0
        if bucket is None or (fill + p.numel()) * p.element_size() > limit:
            bucket = open_buckets[key] = Bucket(g, p.dtype, p.device)
            buckets.append(bucket)
            fill = 0
        bucket.slots.append(Slot(p, i, fill, p.numel()))
    for bucket in buckets:
        last = bucket.slots[-1]
        itemsize = bucket.slots[0].param.element_size()
        bucket.length = zero_layout.round_up(max(last.offset + last.numel, 1), ranks * max(1, ALIGN_BYTES // itemsize))
        bucket.shard_length = bucket.length // ranks
        bucket.shard_start = rank * bucket.shard_length
    return buckets


def signature(buckets, param_groups):
    """What every rank must agree on: each parameter's group, shape and dtype, and which need a
    gradient (picklable, small)."""
    params = [(g, tuple(p.shape), str(p.dtype), bool(p.requires_grad))
              for g, group in enumerate(param_groups) for p in group]
    return params, [(b.group, str(b.dtype), b.length, len(b.slots)) for b in buckets]
