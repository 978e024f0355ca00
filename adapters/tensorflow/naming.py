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
