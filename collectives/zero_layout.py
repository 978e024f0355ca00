"""Arithmetic of the sharded optimizers' flat buckets, whatever the framework: a bucket holds its
variables back to back (each a slot: ``offset`` and ``numel`` in elements), padded to a multiple
of the ranks (times an alignment), and rank r owns the contiguous slice r."""


def round_up(n, multiple):
    return -(-n // multiple) * multiple


def pieces(slots, lo, hi):
    """(slot, first element in the variable, first element in the slice, count) for each slot
    overlapping the slice ``[lo, hi)`` of the bucket."""
    for slot in slots:
        a, b = max(lo, slot.offset), min(hi, slot.offset + slot.numel)
        if a < b:
            yield slot, a - slot.offset, a - lo, b - a
