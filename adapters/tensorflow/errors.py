"""The exception types of Horovod's TensorFlow ops, kept catchable as collectives errors.

Horovod's TF kernels turn the engine's status into TensorFlow's: a cross-rank mismatch (and
"not initialized") is ``tf.errors.FailedPreconditionError``, a bad argument (splits, root
rank, a duplicate name) ``tf.errors.InvalidArgumentError``, a shutdown or stall
``tf.errors.AbortedError``, anything else ``tf.errors.UnknownError``. Here an eager
collective raises an instance of a class derived from BOTH that TensorFlow class and the
collectives class it came from, so ``except tf.errors.FailedPreconditionError`` (Horovod
scripts and tests) and ``except collectives.TensorMismatchError`` both catch it.

Inside a ``tf.function`` the engine is called from a ``tf.py_function``, and TensorFlow itself
chooses the type of a Python exception raised there by its Python class alone: ValueError and
TypeError (every collectives bad-argument error) become ``tf.errors.InvalidArgumentError``;
every other error, mismatches included, ``tf.errors.UnknownError``, whose message starts with
the collectives class name. TensorFlow gives a py_function no way to raise any other type.
"""
import tensorflow as tf

from collectives import errors as core_errors

# The TensorFlow class Horovod's ops raise for each collectives error (most derived first).
_TF_CLASS_OF = [
    (core_errors.TensorMismatchError, tf.errors.FailedPreconditionError),
    (core_errors.NotInitializedError, tf.errors.FailedPreconditionError),
    (core_errors.InvalidArgumentError, tf.errors.InvalidArgumentError),  # DuplicateNameError included
    (core_errors.UnsupportedTypeError, tf.errors.InvalidArgumentError),
    (core_errors.ShutdownError, tf.errors.AbortedError),
    (core_errors.StallTimeoutError, tf.errors.AbortedError),
    (core_errors.CollectivesError, tf.errors.UnknownError),
]

_dual_classes = {}


def tf_error_class(core_class):
    """The TensorFlow error class Horovod raises where collectives raises ``core_class``."""
    for core, tf_class in _TF_CLASS_OF:
        if issubclass(core_class, core):
            return tf_class
    return tf.errors.UnknownError


def dual_class(core_class):
    """A class derived from ``tf_error_class(core_class)`` and ``core_class`` (made once)."""
    cls = _dual_classes.get(core_class)
    if cls is None:
        tf_class = tf_error_class(core_class)

        def __init__(self, message):
            tf_class.__init__(self, None, None, message)

        def __reduce__(self):  # picklable by message, like the collectives class
            return _rebuild, (core_class, self.message)

        cls = type(core_class.__name__, (tf_class, core_class),
                   {"__init__": __init__, "__reduce__": __reduce__, "__module__": __name__,
                    "__doc__": f"{core_class.__name__} raised as TensorFlow's {tf_class.__name__}."})
        _dual_classes[core_class] = cls
    return cls


def _rebuild(core_class, message):
    return dual_class(core_class)(message)


def as_tensorflow_error(error):
    """``error`` (a CollectivesError) re-made as its dual class, with the same message and cause."""
    if isinstance(error, tf.errors.OpError):
        return error
    converted = dual_class(type(error))(str(error))
    converted.__cause__ = error.__cause__
    return converted
