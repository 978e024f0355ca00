"""Names for engine requests that are the same on every rank and on every step.

A training step submits its gradients under one name per step, so the engine's response
cache recognizes them and negotiation shrinks to one small allreduce. The name carries a
digest of the tensors' dtypes and shapes (which every rank shares for an allreduce): two
tapes or optimizers reducing different tensor lists get different names without relying
on per-process counters or variable names, which can differ between ranks (Keras names
layers by how many were created in the process).
"""
import zlib


def digest(arrays, ragged=()):
    """A short hex digest of the arrays' dtypes and shapes; for the indices in ``ragged``
    (allgathered values) only the trailing dimensions count, the first may differ per rank."""
    return digest_of((a.dtype, a.shape[1:] if i in ragged else a.shape) for i, a in enumerate(arrays))


def digest_of(pairs):
    """The digest of (numpy dtype, shape tuple) pairs."""
    return format(zlib.crc32(";".join(f"{dtype.str}{tuple(shape)}" for dtype, shape in pairs).encode()), "08x")


def layout_check_name(prefix, dtypes):
    """The name of the one-time layout check of a gradient list (csrc/frontend/layout_check.h): the
    prefix and a digest of the count and dtypes of the tensors, but not of their shapes, so that
    ranks whose shapes differ (and whose request names therefore differ) meet there."""
    names = [d.name for d in dtypes]
    key = f"{len(names)};" + ";".join(names)
    return f"{prefix}.{zlib.crc32(key.encode()):08x}.layout"


def layout_record(labels, pairs):
    """This rank's record for the layout check: one ``label<TAB>dtype[shape]`` line per tensor,
    from (numpy dtype, shape) pairs; a ``None`` dimension (the rows of allgathered values,
    which may differ per rank) is written ``*``."""
    return "\n".join(f"{label}\t{dtype.name}[{', '.join('*' if d is None else str(d) for d in shape)}]"
                     for label, (dtype, shape) in zip(labels, pairs))
