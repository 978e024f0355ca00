"""TensorFlow ops that run inside the engine, with no Python per step (csrc/tensorflow/tensorflow_kernels.cc).

The engine registers them with the TensorFlow this process loaded, through TensorFlow's stable C
API, the first time they are wanted; nothing is compiled against TensorFlow. Where that fails (a
TensorFlow without one of the C functions, or ``COLLECTIVES_TENSORFLOW_KERNELS=0``), callers fall
back to the ``tf.py_function`` hop (hops.py), which does the same work.

Today there is one: ``reduce_gradients``, what GradientReducer's hop does for dense gradients
(with any reduction but Adasum), used inside a ``tf.function`` (Keras ``model.fit``'s train step,
DistributedGradientTape in a compiled step). Its errors have the types Horovod's ops raise
(``tf.errors.FailedPreconditionError`` for a mismatch, ``AbortedError`` after a shutdown, ...).
"""
import warnings

import numpy as np
import tensorflow as tf

from collectives import config
from collectives._loader import engine_module

from .hops import check_not_tf1_graph, check_not_xla
from .naming import digest_of
from .tensors import SUPPORTED_DTYPES

try:  # private, but the way every generated op wrapper builds its node
    from tensorflow.python.framework import op_def_library as _op_def_library
except ImportError:  # pragma: no cover - a future TensorFlow without it
    _op_def_library = None

_OP = "CollectivesReduceGradients"
_problem = None  # None: not tried yet; "": registered; else why the ops are unavailable
_disabled = False  # set_enabled(False): the py_function path, for comparisons in one process


def set_enabled(enabled):
    """Use the ops in functions traced from now on (default), or not: benchmarks compare both
    paths in one run (COLLECTIVES_TENSORFLOW_KERNELS=0 turns them off for the whole process)."""
    global _disabled
    _disabled = not enabled


def unavailable_reason():
    """"" when the ops are registered (registering them on the first call), else why not."""
    global _problem
    if _problem is None:
        if not config.read("tensorflow_kernels"):
            _problem = "COLLECTIVES_TENSORFLOW_KERNELS=0"
        elif _op_def_library is None:
            _problem = "tensorflow.python.framework.op_def_library is missing"
        else:
            _problem = engine_module().register_tensorflow_kernels()
            if _problem:  # works on, only slower: say so once
                warnings.warn(f"collectives: the engine's TensorFlow ops are unavailable ({_problem}); gradients "
                              "are reduced through tf.py_function instead")
    return _problem


def can_reduce_gradients(inputs):
    """Whether ``reduce_gradients`` takes these tensors: graph tensors (inside a tf.function) of
    fully known shapes and of dtypes the op reduces, and the ops registered."""
    if _disabled or tf.executing_eagerly() or not inputs:
        return False
    if not all(t.shape.is_fully_defined() and t.dtype in SUPPORTED_DTYPES for t in inputs):
        return False
    return unavailable_reason() == ""


def base_digest(inputs):
    """The digest of the inputs' dtypes and shapes that the numpy hop would compute from the
    arrays (naming.digest), so both paths name their requests alike."""
    return digest_of((np.dtype(t.dtype.as_numpy_dtype), tuple(t.shape.as_list())) for t in inputs)


def reduce_gradients(inputs, group_sizes, base_name, op, prescale, postscale, process_set_id, layout_check="",
                     layout=""):
    """The op's outputs: ``inputs`` reduced over the ranks, group by group (``group_sizes``
    consecutive inputs each), under the names ``<base_name>.g<j>`` (see the kernel). Before the
    first reduction of this layout on the engine, the layout check named ``layout_check`` with
    this rank's record ``layout`` (csrc/frontend/layout_check.h; none when empty). Refused in a TF1 graph
    or an XLA-compiled function, as the py_function hop (hops.py) is."""
    check_not_tf1_graph("reduce_gradients")
    check_not_xla("reduce_gradients")
    _, _, node, _ = _op_def_library._apply_op_helper(
        _OP, tensors=list(inputs), group_sizes=[int(n) for n in group_sizes], base_name=base_name,
        reduce_op=int(op), scales=f"{float(prescale)!r} {float(postscale)!r}", process_set=int(process_set_id),
        layout_check=str(layout_check), layout=str(layout), name="collectives_reduce_gradients")
    return list(node.outputs)
