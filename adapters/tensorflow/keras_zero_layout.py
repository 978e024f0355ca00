"""The flat bucket layout of the sharded Keras optimizer (keras_zero_optimizer.py), as the torch
one (adapters/torch/zero_buckets.py): which variables travel together, where each sits in its
bucket, and which contiguous slice of every bucket this rank owns.

The trainable variables the optimizer is built on are grouped by dtype, in reverse order (the
order gradients are produced), and cut into buckets of at most ``BUCKET_BYTES`` (a larger
variable gets a bucket of its own). A bucket's length is padded to a multiple of
``ranks * ALIGN_BYTES / itemsize`` elements, so every rank owns exactly ``length / ranks``
elements: even shards whatever the model. The padding holds zeros and is never written back.
The layout depends only on the variables and the number of ranks, so every rank computes the
same one; ``signature()`` is what the ranks compare.
"""
from dataclasses import dataclass, field

import tensorflow as tf

from collectives import zero_layout

BUCKET_BYTES = 16 * 1024 * 1024  # MPICH copies a message above 32 MiB through fresh pages (NOTES.md)
ALIGN_BYTES = 64


@dataclass
class Slot:
    """One variable's place in its bucket."""

    index: int      # the variable's position in the list the optimizer was built on
    offset: int     # first element in the bucket
    numel: int
    shape: tuple


@dataclass
class Bucket:
    dtype: tf.DType
    slots: list = field(default_factory=list)
    length: int = 0         # padded: a multiple of ranks (and of the alignment)
    shard_start: int = 0    # this rank's slice: [shard_start, shard_start + shard_length)
    shard_length: int = 0

    def used(self):
        """Elements holding variables (the rest is padding)."""
        return self.slots[-1].offset + self.slots[-1].numel

    def pieces(self, start=None, length=None):
        """(slot, first element in the variable, first element in the slice, count) for each
        variable overlapping the slice ``[start, start + length)`` (this rank's shard by default)."""
        lo = self.shard_start if start is None else start
        hi = lo + (self.shard_length if length is None else length)
        return zero_layout.pieces(self.slots, lo, hi)


def _numel(shape):
    n = 1
    for d in shape:
        n *= d
    return n


def build_buckets(variables, ranks, rank, bucket_bytes=None):
    """The buckets of ``variables`` (Keras or TF variables of fully known shapes) for ``rank`` of ``ranks``."""
    limit = BUCKET_BYTES if bucket_bytes is None else bucket_bytes
    open_buckets = {}  # dtype -> the bucket being filled
    buckets = []
    for i in reversed(range(len(variables))):
        v = variables[i]
        dtype = tf.as_dtype(v.dtype)
        shape = tuple(int(d) for d in v.shape)
        n = _numel(shape)
        bucket = open_buckets.get(dtype)
        fill = bucket.used() if bucket is not None else 0
        if bucket is None or (fill + n) * dtype.size > limit:
            bucket = open_buckets[dtype] = Bucket(dtype)
            buckets.append(bucket)
            fill = 0
        bucket.slots.append(Slot(i, fill, n, shape))
    for bucket in buckets:
        bucket.length = zero_layout.round_up(max(bucket.used(), 1), ranks * max(1, ALIGN_BYTES // bucket.dtype.size))
        bucket.shard_length = bucket.length // ranks
        bucket.shard_start = rank * bucket.shard_length
    return buckets


def signature(buckets, variables):
    """What every rank must agree on: each variable's shape and dtype (picklable, small)."""
    params = [(0, tuple(int(d) for d in v.shape), tf.as_dtype(v.dtype).name, True) for v in variables]
    return params, [(b.dtype.name, b.length, len(b.slots)) for b in buckets]
