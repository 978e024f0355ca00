"""Names for engine requests that are the same on every rank and on every step.

A training step submits its gradients under one name per step, so the engine's response
cache recognizes them and negotiation shrinks to one small allreduce. The name carries a
digest of the tensors' dtypes and shapes (which every rank shares for an allreduce): two
tapes or optimizers reducing different tensor lists get different names without relying
on per-process counters or variable names, which can differ between ranks (Keras names
layers by how many were created in the process).
"""
import re
import zlib

import tensorflow as tf


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


def horovod_graph_name(kind, grouped=False):
    """horovod.tensorflow's rule, as a ``rename(tensors, name)`` for collectives/renaming.py: a
    given name stays; an unnamed call being traced into a graph (tf.function) gets Horovod's
    name of its op, after its input: ``Horovod<kind>_<input tensor's name>``
    (``HorovodGrouped<kind>_<first>_<last>`` for a group), every character outside
    [A-Za-z0-9_] made '_', then made unique in the graph as TensorFlow makes op names unique
    ('_1', '_2', ...), without the name scope (adapters/tensorflow/mpi_ops.py). The same traced
    program gives the same names on every rank, as in Horovod. Eagerly, and for inputs that are
    not TensorFlow tensors or variables (Horovod needs one), the core names the call."""
    def rename(tensors, name):
        if name is not None or tf.executing_eagerly():
            return name
        tensors = list(tensors) if grouped else [tensors]
        names = [getattr(t, "name", None) for t in tensors[:1] + tensors[-1:]]
        if len(names) != 2 or not all(isinstance(n, str) for n in names):
            return name
        base = f"HorovodGrouped{kind}_{names[0]}_{names[1]}" if grouped else f"Horovod{kind}_{names[0]}"
        unique = tf.compat.v1.get_default_graph().unique_name(re.sub("[^a-zA-Z0-9_]", "_", base))
        return unique.rsplit("/", 1)[-1]
    return rename

