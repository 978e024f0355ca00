"""Which Keras an object comes from: Keras 3 (``keras``) or Keras 2 (``tf_keras``).

TensorFlow >= 2.16 ships Keras 3 as ``tf.keras``; Keras 2 code keeps running on the
``tf_keras`` package, either imported directly or as ``tf.keras`` under
``TF_USE_LEGACY_KERAS=1`` (read when TensorFlow is imported). Both can be loaded in one
process, so collectives decides per object: ``FLAVORS`` lists one ``KerasFlavor`` per Keras,
and ``flavor_of(obj)`` is the one whose classes ``obj`` is an instance of. Each flavor knows the
few things that differ between them for an optimizer (its variables, how to build them), a
layer, a model, a saved file and a callback.

A module is never imported here to answer "does this object come from it": an object of a
tf_keras class means tf_keras is already in ``sys.modules``.
"""
import json
import os
import sys
import zipfile

import tensorflow as tf


class CollectivesOptimizer:
    """Marker base of every collectives DistributedOptimizer class (both Kerases)."""


def _truthy(name):
    # TensorFlow's own test of the variable (tensorflow/python/util/lazy_loader.py).
    return os.environ.get(name, "").lower() in ("true", "1")


class KerasFlavor:
    """One Keras. ``module()`` is its top-level module when loaded (None otherwise)."""

    name = ""
    module_name = ""

    def module(self):
        return sys.modules.get(self.module_name)

    def import_module(self):
        import importlib

        return importlib.import_module(self.module_name)

    def load_model(self, filepath, custom_objects):
        return self.import_module().models.load_model(filepath, custom_objects=custom_objects or None)

    def _classes(self, kind):
        raise NotImplementedError

    def owns(self, obj, kind):
        """``obj`` is a ``kind`` ("optimizer", "model", "layer") of this Keras."""
        classes = self._classes(kind) if self.module() is not None else ()
        return bool(classes) and isinstance(obj, classes)

    def optimizer_built(self, optimizer):
        raise NotImplementedError

    def build_optimizer(self, optimizer, variables):
        """Create ``optimizer``'s variables (slots, iterations) for ``variables`` if it has none yet."""
        raise NotImplementedError

    def optimizer_variables(self, optimizer):
        variables = optimizer.variables
        return list(variables() if callable(variables) else variables)

    def replicated_optimizer_variables(self, optimizer):
        """The optimizer's variables that every rank holds alike, which a broadcast may overwrite:
        all of them, except a sharded optimizer's slices of the state (each rank holds its own:
        keras_zero_optimizer.py)."""
        return replicated_only(optimizer, self.optimizer_variables(optimizer))


def replicated_only(optimizer, variables):
    """``variables`` without those ``optimizer.sharded_variables()`` names (when it has that method)."""
    sharded = getattr(optimizer, "sharded_variables", None)
    if sharded is None:
        return list(variables)
    own = {id(v) for v in sharded()}
    return [v for v in variables if id(v) not in own]


class Keras3(KerasFlavor):
    name = "Keras 3"
    module_name = "keras"

    def _classes(self, kind):
        keras = self.module()
        return {"optimizer": (keras.optimizers.Optimizer,), "model": (keras.Model,),
                "layer": (keras.layers.Layer,)}[kind]

    def optimizer_built(self, optimizer):
        return bool(optimizer.built)

    def build_optimizer(self, optimizer, variables):
        if not optimizer.built:
            optimizer.build(list(variables))


class Keras2(KerasFlavor):
    """tf_keras: new-style ``tf_keras.optimizers.Optimizer`` and the legacy ``OptimizerV2``
    (``tf_keras.optimizers.legacy``), which share no base class."""

    name = "Keras 2 (tf_keras)"
    module_name = "tf_keras"

    def _classes(self, kind):
        tf_keras = self.module()
        return {"optimizer": (tf_keras.optimizers.Optimizer, tf_keras.optimizers.legacy.Optimizer),
                "model": (tf_keras.Model,), "layer": (tf_keras.layers.Layer,)}[kind]

    def is_legacy(self, optimizer):
        return isinstance(optimizer, self.module().optimizers.legacy.Optimizer)

    def optimizer_built(self, optimizer):
        if self.is_legacy(optimizer):
            return bool(optimizer.weights)
        return bool(getattr(optimizer, "_built", False))

    def build_optimizer(self, optimizer, variables):
        with tf.init_scope():  # plain variables, created eagerly even inside a tf.function
            if self.is_legacy(optimizer):
                optimizer._create_all_weights(list(variables))  # iterations, hyperparameters, slots
            else:
                optimizer.build(list(variables))  # returns at once when built


KERAS3, KERAS2 = Keras3(), Keras2()
FLAVORS = [KERAS3, KERAS2]


def flavor_of(obj, kind="optimizer"):
    """The flavor whose ``kind`` class ``obj`` is an instance of, or None."""
    for flavor in FLAVORS:
        if flavor.owns(obj, kind):
            return flavor
    return None


def keras2_requested():
    """Keras 2 is (or will be) in use in this process: ``TF_USE_LEGACY_KERAS`` makes ``tf.keras``
    be tf_keras, or tf_keras was imported directly."""
    return _truthy("TF_USE_LEGACY_KERAS") or "tf_keras" in sys.modules


def _saved_keras_version(filepath):
    """The Keras version a saved model records ("2.x" or "3.x"), or None if it says none."""
    path = os.fspath(filepath)
    if os.path.isdir(path):
        return "2" if os.path.exists(os.path.join(path, "saved_model.pb")) else None  # SavedModel: Keras 2 only
    if zipfile.is_zipfile(path):  # a .keras archive
        with zipfile.ZipFile(path) as archive:
            if "metadata.json" in archive.namelist():
                return str(json.loads(archive.read("metadata.json")).get("keras_version", "")) or None
        return None
    try:
        import h5py
    except ImportError:  # pragma: no cover - h5py comes with both Kerases
        return None
    try:
        with h5py.File(path, "r") as f:
            version = f.attrs.get("keras_version")
    except OSError:
        return None
    if isinstance(version, bytes):
        version = version.decode()
    return str(version) if version else None


def flavor_of_saved_model(filepath):
    """The Keras that wrote ``filepath`` (what it records), else Keras 2 where requested, else Keras 3."""
    version = _saved_keras_version(filepath)
    if version is not None:
        return KERAS2 if version.startswith("2") else KERAS3
    return KERAS2 if keras2_requested() else KERAS3
