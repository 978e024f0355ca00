"""Horovod's ``TensorFlowKerasState`` (a Keras model and its optimizer) and ``TensorFlowState``
(a list of tf.Variables), for TensorFlow 2 eager execution, Keras 3 and Keras 2 (tf_keras).

A commit copies every variable's value to a numpy array (Horovod keeps ``tf.identity`` copies;
on the CPU both are one copy), which is also what the commit file holds. Keras builds an
optimizer's variables lazily, at its first step: the state builds them at once (as its Keras
does: keras_flavors), so a commit taken before the first step, or restored into a fresh
process, has every slot variable.

A sharded optimizer (``zero_stage``, keras_zero_optimizer.py) commits in memory only this rank's
slices (1/N of the state). A commit file restarts the job from any one rank's file at any size,
so it holds every rank's slices (one allgather when the commit is handed to the writer): a
restart takes its slices at the new size (keras_zero_sharded.py), as TorchState does.
"""
import numpy as np
import tensorflow as tf

from collectives.basics import rank
from collectives.elastic.state import ObjectState

from . import keras_zero_sharded
from .keras_flavors import flavor_of, replicated_only
from .mpi_ops import broadcast_object, broadcast_variables


def _optimizer_variables(optimizer):
    flavor = flavor_of(optimizer)
    if flavor is not None:
        return flavor.optimizer_variables(optimizer)
    variables = optimizer.variables
    return list(variables() if callable(variables) else variables)


def _values(variables):
    return [np.array(v.numpy(), copy=True) for v in variables]


def _assign(variables, values, what):
    if len(variables) != len(values):
        raise ValueError(f"cannot restore {what}: the commit has {len(values)} variables, "
                         f"the {what} has {len(variables)}")
    for var, value in zip(variables, values):
        var.assign(value)


def _sharded(optimizer):
    """A ``zero_stage`` optimizer (keras_zero_optimizer.py): each rank holds only its slices of the state."""
    return optimizer is not None and hasattr(optimizer, "gather_sharded_state_dicts")


def _gather_shards(optimizer, saved):
    """Collective (every rank commits together): every rank's sharded state dict of the values
    ``saved`` at the last save, for a commit file that restarts the job at any size from any rank's copy."""
    values = {id(v): value for v, value in zip(_optimizer_variables(optimizer), saved)}
    return optimizer.gather_sharded_state_dicts(keras_zero_sharded.sharded(optimizer, values))


def _mixed_commit_error(committed_sharded, what="the optimizer"):
    if committed_sharded:
        return ValueError(f"cannot restore {what}: the commit has a sharded optimizer's state (zero_stage=1 or 2) "
                          f"and this optimizer is not sharded; restore it into DistributedOptimizer(..., "
                          f"zero_stage=1 or 2)")
    return ValueError(f"cannot restore {what}: the commit has an unsharded optimizer's state and this optimizer "
                      f"is sharded (zero_stage=1 or 2); restore it into the unsharded optimizer it was committed "
                      f"from")


class TensorFlowKerasState(ObjectState):
    """State of a Keras model and its optimizer (``model.optimizer`` when not given), plus any
    picklable keyword arguments as attributes. ``backend`` is Horovod's TF1 argument (unused)."""

    def __init__(self, model, optimizer=None, backend=None, **kwargs):
        if hasattr(model, "built") and not model.built:
            raise ValueError("Model must be built first. Run `model.build(input_shape)`.")
        self.model = model
        self.optimizer = optimizer if optimizer is not None else model.optimizer
        self.backend = backend
        flavor = flavor_of(self.optimizer)
        if flavor is not None:
            flavor.build_optimizer(self.optimizer, self.model.trainable_variables)
        self._save_model()
        super().__init__(bcast_object=broadcast_object, get_rank=rank, **kwargs)

    def save(self):
        self._save_model()
        super().save()

    def restore(self):
        self._load_model()
        super().restore()

    def sync(self):
        broadcast_variables(self.model.variables, root_rank=0)
        if self.optimizer is not None:
            # A sharded optimizer's slices of the state stay each rank's own (keras_zero_optimizer.py).
            broadcast_variables(replicated_only(self.optimizer, _optimizer_variables(self.optimizer)), root_rank=0)
        self._save_model()
        super().sync()

    def _save_model(self):
        self._saved_model_state = _values(self.model.variables)
        self._saved_optimizer_state = _values(_optimizer_variables(self.optimizer)) if self.optimizer else []

    def _load_model(self):
        _assign(self.model.variables, self._saved_model_state, "model")
        if self.optimizer is not None:
            _assign(_optimizer_variables(self.optimizer), self._saved_optimizer_state, "optimizer")

    def _persistent_state(self):
        obj = super()._persistent_state()
        obj["model"] = self._saved_model_state
        obj["optimizer"] = self._saved_optimizer_state
        if _sharded(self.optimizer):
            obj["optimizer"] = {"zero_shards": _gather_shards(self.optimizer, self._saved_optimizer_state)}
        return obj

    def _load_persistent_state(self, obj):
        self._saved_model_state = list(obj["model"])
        saved = obj["optimizer"]
        committed_sharded = isinstance(saved, dict) and "zero_shards" in saved
        if committed_sharded != _sharded(self.optimizer):
            raise _mixed_commit_error(committed_sharded)
        if committed_sharded:
            # Every rank's slices, written at any size: this rank takes its slices at the new size.
            _assign(self.model.variables, self._saved_model_state, "model")
            self.optimizer.load_sharded_state_dict(saved["zero_shards"])
            self._saved_optimizer_state = _values(_optimizer_variables(self.optimizer))
        else:
            self._saved_optimizer_state = list(saved)
            self._load_model()
        super()._load_persistent_state(obj)


class TensorFlowState(ObjectState):
    """State of a list of ``tf.Variable`` (eager TensorFlow 2; ``variables`` is required, TF1's
    global-variable collection being empty when executing eagerly)."""

    def __init__(self, variables=None, session=None, **kwargs):
        if variables is None:
            variables = tf.compat.v1.global_variables()
        if not variables:
            raise ValueError("TensorFlowState needs the variables to track (eager TensorFlow 2 has no "
                             "global variable collection)")
        self.variables = list(variables)
        self.session = session
        self._values = _values(self.variables)
        super().__init__(bcast_object=broadcast_object, get_rank=rank, **kwargs)

    def save(self):
        self._values = _values(self.variables)
        super().save()

    def restore(self):
        _assign(self.variables, self._values, "variable list")
        super().restore()

    def sync(self):
        broadcast_variables(self.variables, root_rank=0)
        self._values = _values(self.variables)
        super().sync()

    def _persistent_state(self):
        obj = super()._persistent_state()
        obj["variables"] = self._values
        return obj

    def _load_persistent_state(self, obj):
        self._values = list(obj["variables"])
        _assign(self.variables, self._values, "variable list")
        super()._load_persistent_state(obj)
