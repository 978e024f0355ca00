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

TensorFlow 1 graphs (a ``tf.compat.v1`` session: ``tf.Graph().as_default()`` or
``disable_eager_execution()``) are refused when the hop is built, with
``GraphModeNotSupportedError`` (``check_not_tf1_graph``). A session runs independent ops in
whatever order its inter-op threads pick them, differently on each rank, and a ``py_function``
hop holds its thread while it waits for the other ranks: two ranks could pair different
tensors under one automatic name (silently wrong results) or each block every thread on a
collective the other has not reached yet (a deadlock). Horovod avoids both with asynchronous
kernels and graph-fixed names for every collective, which we have not built (our one kernel,
engine_ops.py, is synchronous too); a ``tf.function`` orders its stateful ops, so it has
neither problem.

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


class GraphModeNotSupportedError(CollectivesError):
    """A collective was placed in a TensorFlow 1 graph (one run by a ``tf.compat.v1.Session``)."""

    __init__ = Exception.__init__  # keeps its type through autograph, as XlaNotSupportedError


def in_tf1_graph():
    """True while building a TensorFlow 1 graph, or a tf.function called from one: the
    outermost context (what ``tf.init_scope`` lifts to) is then a graph, not eager execution.
    A tf.function or a tf.data function traced by an eager program is not one."""
    if tf.executing_eagerly():
        return False
    with tf.init_scope():
        return not tf.executing_eagerly()


def check_not_tf1_graph(what):
    if in_tf1_graph():
        raise GraphModeNotSupportedError(
            f"collectives: {what} cannot be placed in a TensorFlow 1 graph (tf.compat.v1 session, "
            "tf.Graph().as_default() or tf.compat.v1.disable_eager_execution()): a session runs independent "
            "collectives in a different order on each rank, which can pair different tensors or deadlock, so "
            "collectives refuses TF1 graphs. Run eagerly or inside tf.function (TensorFlow 2 style).")


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
    """Run ``fn(list of numpy arrays) -> list of numpy arrays (or tf.Tensors)`` over ``inputs``
    (tf.Tensors).

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
        return [_as_output(a) for a in arrays]
    check_not_tf1_graph(what)
    check_not_xla(what)

    def body(*tensors):
        return [_as_output(a) for a in fn([to_numpy(t) for t in tensors])]

    outputs = tf.py_function(body, inputs, out_dtypes, name=_op_name(what))
    if not isinstance(outputs, (list, tuple)):
        outputs = [outputs]
    outputs = list(outputs)
    for out, shape in zip(outputs, out_shapes or []):
        if shape is not None:
            out.set_shape(shape)
    return outputs


def _as_output(result):
    # ``fn`` may return tf.Tensors it made itself (gradient_reducer.py shares aligned views
    # without to_tensor's checks); numpy arrays are converted here.
    return result if isinstance(result, tf.Tensor) else to_tensor(result)


def _op_name(what):
    # A readable graph op name ("collectives_allreduce"); TensorFlow makes it unique.
    return "collectives_" + "".join(c if c.isalnum() else "_" for c in what)
