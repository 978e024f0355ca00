"""``CollectivesCallback``: the base of collectives' Keras callbacks, usable in the ``fit`` of
either Keras.

A callback is made before we can know which ``fit`` it goes to, and Keras 2 (tf_keras) and
Keras 3 each want their own ``Callback`` class (tf_keras' CallbackList calls private hooks such
as ``_implements_train_batch_hooks`` that Keras 3's class lacks). Our callbacks are Keras 3
callbacks; where Keras 2 is in use in the process (``TF_USE_LEGACY_KERAS=1``, or tf_keras
imported: keras_flavors.keras2_requested), each one is made as an object of a twin class that
also derives from ``tf_keras.callbacks.Callback``, so it is an instance of both and works in
both ``fit``s. The two bases share the hook names and the ``_is_default`` marking of unused
hooks; Keras 3's ``set_model``/``model`` come first and serve both.
"""
import keras

from .keras_flavors import keras2_requested

_twins = {}  # callback class -> its twin that is also a tf_keras Callback


def _twin(cls):
    if cls not in _twins:
        import tf_keras

        # tf_keras' Callback.__init__ (not run: Keras 3's comes first) would set these.
        defaults = {"validation_data": None, "_chief_worker_only": None, "_supports_tf_logs": False}
        _twins[cls] = type(cls.__name__, (cls, tf_keras.callbacks.Callback),
                           {"__module__": cls.__module__, "__qualname__": cls.__qualname__, **defaults})
    return _twins[cls]


def class_in_use(cls):
    """The class to make an object of callback class ``cls`` from: ``cls``, or its twin where
    Keras 2 is in use (for ``__new__``)."""
    return _twin(cls) if keras2_requested() else cls


class CollectivesCallback(keras.callbacks.Callback):
    """A Keras 3 Callback that is also a tf_keras Callback where Keras 2 is in use."""

    def __new__(cls, *args, **kwargs):
        return super().__new__(class_in_use(cls))
