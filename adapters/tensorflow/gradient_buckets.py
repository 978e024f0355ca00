"""One flat buffer per dtype for a group of dense gradients, so that the engine reduces the
group with one request (and, on the host, one MPI call) instead of one per gradient.

Per request the engine pays a negotiation entry, a hand-off and an MPI call, and it reduces
large tensors one by one while fusing only the small ones; on the 2-core VM a grouped
allreduce of an MLP's six gradients (2.7 MB, or 0.2 MB) took 1.4 to 2 times as long as one
allreduce of the same bytes (benchmarks/keras_fit_overhead.py, docs/performance.md).
Packing them here costs one copy of the gradients, which the out-of-place reduction paid
anyway (its outputs are new buffers), and the buffer is then reduced in place.

Each gradient starts at a 64-byte boundary of the buffer (an engine-allocated, 64-byte
aligned array), so its result is a contiguous, aligned, writable view that TensorFlow
borrows through DLPack without a copy (adapters/tensorflow/tensors.py: ``share``). The gaps
between gradients are zeroed, so every rank reduces the same defined bytes. The results are
the same as reducing each gradient alone: an elementwise reduction does not see where one
tensor ends (Adasum does, and is never packed: see gradient_reducer.py).
"""
import numpy as np

from collectives.arrays import aligned_empty

from .tensors import ALIGNMENT


class Bucket:
    """Where each member (a position in the hop's input list) lives in one flat buffer of
    ``dtype``: ``slots`` holds (position, start, stop, shape) in elements."""

    __slots__ = ("dtype", "slots", "gaps", "total")

    def __init__(self, dtype, members):
        self.dtype = dtype
        step = max(1, ALIGNMENT // dtype.itemsize)  # elements per 64 bytes
        self.slots, self.gaps = [], []
        offset = 0
        for position, shape in members:
            size = int(np.prod(shape, dtype=np.int64))
            self.slots.append((position, offset, offset + size, shape))
            end = -(-(offset + size) // step) * step
            if end > offset + size:
                self.gaps.append((offset + size, end))
            offset = end
        self.total = offset

    def pack(self, arrays):
        """A new aligned buffer holding the members of ``arrays`` (numpy views of the inputs)."""
        flat = aligned_empty((self.total,), self.dtype)
        for position, start, stop, _ in self.slots:
            flat[start:stop] = arrays[position].reshape(-1)
        for start, stop in self.gaps:
            flat[start:stop] = 0
        return flat

    def unpack(self, flat, out):
        """Write each member's result (an aligned view of ``flat``) into ``out[position]``."""
        for position, start, stop, shape in self.slots:
            out[position] = flat[start:stop].reshape(shape)


def plan_buckets(arrays, positions):
    """The buckets of the gradients at ``positions``: one per dtype, in order of first use."""
    members = {}
    for p in positions:
        a = arrays[p]
        members.setdefault(a.dtype, []).append((p, a.shape))
    return [Bucket(dtype, m) for dtype, m in members.items()]
