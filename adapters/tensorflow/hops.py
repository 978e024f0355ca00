"""One hop from TensorFlow to the engine: a Python function on numpy arrays, run directly
when executing eagerly and as one ``tf.py_function`` inside a ``tf.function``.

Every collective of this adapter goes through ``run_hop``. A hop takes a flat list of
tensors and returns a flat list; the numpy function it runs submits all of its engine
requests before waiting for any, so one hop over many tensors costs one Python call per
step (about 0.5 ms) instead of one per tensor, and the engine can fuse what it receives.

Names: the numpy function runs when the hop executes, not when a ``tf.function`` is
traced, so automatic names (``collectives.ops``' per-kind counters) are drawn in
execution order, the same on every rank that runs the same program, eagerly or not.
Inside a ``tf.function``, ``py_function`` ops are stateful and run in program order.

XLA cannot run a ``py_function`` (it fails at run time with an ``EagerPyFunc`` kernel
error); a hop traced inside an XLA-compiled function raises ``XlaNotSupportedError``
at trace time instead.

Errors: an eager hop raises collectives errors as the TensorFlow types Horovod's ops raise
(``errors.as_tensorflow_error``); inside a ``tf.function`` TensorFlow types them itself.
"""
import tensorflow as tf

from collectives.errors import CollectivesError

from .errors import as_tensorflow_error
from .tensors import to_numpy, to_tensor

try:  # private, but the only way to see that a function is being traced for XLA
    from tensorflow.python.framework import ops as _tf_ops
    from tensorflow.python.ops import control_flow_util as _cf_util
except ImportError:  # pragma: no cover - a future TensorFlow without these modules
    _tf_ops = _cf_util = None


class XlaNotSupportedError(CollectivesError, ValueError):
    """A collective was placed in an XLA-compiled function (``jit_compile=True``)."""

    # Autograph re-raises errors from traced code as their own type only for exceptions
    # constructed like Exception (others become a StagingError).
    __init__ = Exception.__init__


def in_xla_context():
    """True while tracing a function compiled with XLA (``tf.function(jit_compile=True)``)."""
    if _cf_util is None or tf.executing_eagerly():
        return False
    return bool(_cf_util.GraphOrParentsInXlaContext(_tf_ops.get_default_graph()))


def check_not_xla(what):
    if in_xla_context():
        raise XlaNotSupportedError(
            f"collectives: {what} cannot run inside an XLA-compiled function (jit_compile=True): the engine is "
            "called through tf.py_function, which XLA cannot compile. Use tf.function(jit_compile=False); for "
            "Keras, compile the model with jit_compile=False, or add "
            "collectives.keras.callbacks.BroadcastGlobalVariablesCallback (or MetricAverageCallback) to fit(), "
            "which turns XLA off for the train step.")


def run_hop(fn, inputs, out_dtypes, what, out_shapes=None):
    """Run ``fn(list of numpy arrays) -> list of numpy arrays`` over ``inputs`` (tf.Tensors).

    Returns a list of tf.Tensors of ``out_dtypes``. ``out_shapes`` (TensorShapes or None)
    are set on the outputs of a traced hop, whose shapes TensorFlow cannot infer.
    """
    inputs = list(inputs)
    out_dtypes = list(out_dtypes)
    if tf.executing_eagerly():
        try:
            arrays = fn([to_numpy(t) for t in inputs])
        except CollectivesError as error:  # as Horovod's TF ops raise it (adapters/tensorflow/errors.py)
            raise as_tensorflow_error(error).with_traceback(error.__traceback__) from None
        return [to_tensor(a) for a in arrays]
    check_not_xla(what)

    def body(*tensors):
        return [to_tensor(a) for a in fn([to_numpy(t) for t in tensors])]

    outputs = tf.py_function(body, inputs, out_dtypes, name=_op_name(what))
    if not isinstance(outputs, (list, tuple)):
        outputs = [outputs]
    outputs = list(outputs)
    for out, shape in zip(outputs, out_shapes or []):
        if shape is not None:
            out.set_shape(shape)
    return outputs


def _op_name(what):
    # A readable graph op name ("collectives_allreduce"); TensorFlow makes it unique.
    return "collectives_" + "".join(c if c.isalnum() else "_" for c in what)
