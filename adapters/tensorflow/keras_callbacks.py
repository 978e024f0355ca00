"""horovod.tensorflow.keras.callbacks: BroadcastGlobalVariablesCallback,
MetricAverageCallback, LearningRateScheduleCallback, LearningRateWarmupCallback (for the
``fit`` of Keras 3 and of Keras 2, tf_keras: see keras_callback_base.py), BestModelCheckpoint.

Each of them, at the start of ``fit``, also turns XLA off for the train step when the
model's optimizer is a DistributedOptimizer and the model was compiled with
``jit_compile=True`` (XLA cannot run the engine's ``tf.py_function``): it sets
``model.jit_compile = False`` and rebuilds the train function, with a warning.
"""
import warnings

import keras
import numpy as np

from collectives import basics
from collectives import ops as core
from collectives.constants import Average

from .gradient_reducer import backing_variable
from .keras_callback_base import CollectivesCallback, class_in_use
from .keras_flavors import CollectivesOptimizer, flavor_of
from .mpi_ops import broadcast_variables
from .naming import digest


def turn_off_xla_for_collectives(model):
    """Rebuild ``model``'s train step without XLA if it would run a DistributedOptimizer under
    XLA. Returns True when it changed something."""
    if model is None or not isinstance(getattr(model, "optimizer", None), CollectivesOptimizer):
        return False
    if getattr(model, "run_eagerly", False) or not getattr(model, "jit_compile", False):
        return False
    warnings.warn("collectives: the model was compiled with jit_compile=True, but DistributedOptimizer calls the "
                  "engine through tf.py_function, which XLA cannot compile; the train step runs without XLA.",
                  stacklevel=3)
    model.jit_compile = False
    model.make_train_function(force=True)
    return True


class _CollectivesCallback(CollectivesCallback):
    def on_train_begin(self, logs=None):
        turn_off_xla_for_collectives(self.model)


class BroadcastGlobalVariablesCallback(_CollectivesCallback):
    """Broadcast the model's and the optimizer's variables from ``root_rank`` when training
    starts, so every rank begins from the same state (random initialization or a checkpoint
    restored on one rank). Keras 3 builds the optimizer before training starts; if it is not
    built yet then (Keras 2 builds it at the first step), its variables are broadcast after the
    first batch, and so is everything when the model itself has no variables yet.

    ``local_variables`` (Horovod's): variables that keep each rank's own value. Keras 3
    variables have no ``.ref()``; they are recognised by identity (the variable itself or the
    tf.Variable behind it). ``device`` is accepted and ignored."""

    def __init__(self, root_rank, device="", local_variables=None):
        super().__init__()
        self.root_rank = root_rank
        self.broadcast_done = False
        self._optimizer_pending = False
        self._pending = False  # nothing broadcast yet: the model had no variables at the start
        if local_variables is not None and not isinstance(local_variables, (list, tuple, set)):
            local_variables = [local_variables]
        self.local_variables = list(local_variables or [])

    def _shared(self, variables):
        local = {id(x) for v in self.local_variables for x in (v, backing_variable(v)) if x is not None}
        return [v for v in variables if id(v) not in local and id(backing_variable(v)) not in local]

    def _optimizer_variables(self):
        optimizer = getattr(self.model, "optimizer", None)
        flavor = flavor_of(optimizer)
        if flavor is None or not flavor.optimizer_built(optimizer):
            return None
        return flavor.replicated_optimizer_variables(optimizer)  # not a sharded optimizer's own slices

    def _broadcast(self, variables):
        broadcast_variables(self._shared(variables), root_rank=self.root_rank)

    def on_train_begin(self, logs=None):
        super().on_train_begin(logs)
        if self.broadcast_done:
            return
        if not getattr(self.model, "built", True):
            # A model without input shapes (Keras 2 Sequential()) has no variables before its
            # first batch: everything is broadcast after it, as Horovod's callback does.
            self._pending = True
            return
        optimizer_vars = self._optimizer_variables()
        self._broadcast(self.model.variables)
        if optimizer_vars is None:
            self._optimizer_pending = True
        else:
            self._broadcast(optimizer_vars)
        self.broadcast_done = True

    def on_train_batch_end(self, batch, logs=None):
        if self._pending:
            self._broadcast(self.model.variables)
            self._broadcast(self._optimizer_variables() or [])
            self._pending = False
            self.broadcast_done = True
        elif self._optimizer_pending:
            self._broadcast(self.model.variables)
            self._broadcast(self._optimizer_variables() or [])
            self._optimizer_pending = False


class BestModelCheckpoint(keras.callbacks.ModelCheckpoint):
    """Horovod's: a ModelCheckpoint that saves the whole model whenever ``monitor`` improves
    (``save_best_only=True``). Horovod leaves ``filepath`` to its Spark estimator; Keras 3
    checks the path when the callback is made, so give ``filepath=`` (a ``.keras`` or ``.h5``
    path) or set ``callback.filepath`` before training. Like the other callbacks it also serves
    tf_keras' ``fit`` (keras_callback_base.py)."""

    def __new__(cls, *args, **kwargs):
        return super().__new__(class_in_use(cls))

    def __init__(self, monitor="val_loss", verbose=0, mode="auto", save_freq="epoch", filepath=None):
        super().__init__(filepath="best_model.keras" if filepath is None else filepath, monitor=monitor,
                         verbose=verbose, save_best_only=True, save_weights_only=False, mode=mode,
                         save_freq=save_freq)
        self.filepath = filepath

    def on_train_begin(self, logs=None):
        if self.filepath is None:
            raise ValueError("BestModelCheckpoint needs a filepath: pass filepath= or set callback.filepath")
        super().on_train_begin(logs)


class MetricAverageCallback(_CollectivesCallback):
    """Replace the epoch's metrics in ``logs`` by their averages over the ranks (one grouped
    allreduce per epoch). Put it before callbacks that read the metrics (checkpointing,
    early stopping, schedules); Keras' History, added last, records the averages."""

    def __init__(self, device=""):
        super().__init__()

    def _average_metrics_in_place(self, logs):
        if not logs:
            return
        keys = sorted(k for k, v in logs.items() if _is_number(v))
        if not keys:
            return
        values = [np.asarray(_as_float(logs[k]), dtype=np.float64) for k in keys]
        name = "MetricAverageCallback." + digest([np.frombuffer(k.encode(), np.uint8) for k in keys])
        averaged = core.grouped_allreduce(values, op=Average, name=name)
        for k, v in zip(keys, averaged):
            logs[k] = float(v)

    def on_epoch_end(self, epoch, logs=None):
        self._average_metrics_in_place(logs)


def _as_float(value):
    return float(keras.ops.convert_to_numpy(value)) if not isinstance(value, (int, float, np.number)) \
        else float(value)


def _is_number(value):
    try:
        _as_float(value)
        return True
    except (TypeError, ValueError):
        return False


def _get_value(variable):
    return float(keras.ops.convert_to_numpy(variable))


class LearningRateScheduleCallback(_CollectivesCallback):
    """Set the learning rate to ``initial_lr * multiplier(epoch)`` from ``start_epoch`` until
    ``end_epoch`` (exclusive): at the first batch of each epoch with ``staircase=True``, at
    every batch with a fractional epoch otherwise. ``multiplier`` is a function of the epoch
    or a constant ``m`` meaning ``m ** epoch``. ``momentum_correction`` scales the momentum by
    new_lr / old_lr for the batch where the rate changes (Goyal et al.), when the optimizer's
    momentum is a variable; Keras 3 keeps SGD's momentum as a Python float baked into the
    compiled step, which cannot be changed per batch, and then the correction is skipped with
    a warning. The epoch's learning rate is logged as ``logs["lr"]``."""

    def __init__(self, initial_lr, multiplier, start_epoch=0, end_epoch=None, staircase=True,
                 momentum_correction=True, steps_per_epoch=None):
        super().__init__()
        if initial_lr is None:
            raise ValueError("Parameter `initial_lr` is required")
        self.initial_lr = initial_lr
        self.multiplier = multiplier if callable(multiplier) else (lambda epoch: multiplier ** epoch)
        self.start_epoch = start_epoch
        self.end_epoch = end_epoch
        self.staircase = staircase
        self.momentum_correction = momentum_correction
        self.steps_per_epoch = steps_per_epoch
        self.current_epoch = None
        self.restore_momentum = None
        self._warned_momentum = False

    def _autodetect_steps_per_epoch(self):
        steps = (self.params or {}).get("steps")
        if steps:
            return steps
        raise ValueError(f"Could not autodetect the number of steps per epoch. Please specify the steps_per_epoch "
                         f"parameter to the {type(self).__name__}().")

    def _optimizer(self):
        return self.model.optimizer

    def _adjust_learning_rate(self, epoch):
        optimizer = self._optimizer()
        old_lr = _get_value(optimizer.learning_rate)
        new_lr = self.initial_lr * self.multiplier(epoch)
        optimizer.learning_rate = new_lr
        if self.momentum_correction and old_lr > 0 and hasattr(optimizer, "momentum"):
            momentum = optimizer.momentum
            if hasattr(momentum, "assign"):
                self.restore_momentum = _get_value(momentum)
                momentum.assign(self.restore_momentum * new_lr / old_lr)
            elif momentum and not self._warned_momentum:
                warnings.warn("collectives: momentum correction skipped: the optimizer's momentum is a Python "
                              "number compiled into the train step, not a variable", stacklevel=2)
                self._warned_momentum = True

    def _restore_momentum_if_needed(self):
        if self.restore_momentum is not None:
            self._optimizer().momentum.assign(self.restore_momentum)
            self.restore_momentum = None

    def on_train_begin(self, logs=None):
        super().on_train_begin(logs)
        if not self.staircase and not self.steps_per_epoch:
            self.steps_per_epoch = self._autodetect_steps_per_epoch()

    def on_epoch_begin(self, epoch, logs=None):
        self.current_epoch = epoch

    def on_train_batch_begin(self, batch, logs=None):
        if self.current_epoch < self.start_epoch or (
                self.end_epoch is not None and self.current_epoch >= self.end_epoch):
            return
        if self.staircase and batch == 0:
            self._adjust_learning_rate(self.current_epoch)
        elif not self.staircase:
            self._adjust_learning_rate(self.current_epoch + float(batch) / self.steps_per_epoch)

    def on_train_batch_end(self, batch, logs=None):
        self._restore_momentum_if_needed()

    def on_epoch_end(self, epoch, logs=None):
        if logs is not None:
            logs["lr"] = _get_value(self._optimizer().learning_rate)


class LearningRateWarmupCallback(LearningRateScheduleCallback):
    """Ramp the learning rate from ``initial_lr / size`` to ``initial_lr`` over
    ``warmup_epochs`` epochs, adjusted every batch (Goyal et al., "Accurate, Large Minibatch
    SGD"): large-batch training with a learning rate scaled by the number of ranks, without
    the early instability."""

    def __init__(self, initial_lr, warmup_epochs=5, momentum_correction=True, steps_per_epoch=None, verbose=0):
        def multiplier(epoch):
            # Shifted by one batch so that each epoch ends on a round value.
            epoch += 1.0 / self.steps_per_epoch
            size = basics.size()
            return 1.0 / size * (epoch * (size - 1) / warmup_epochs + 1)

        super().__init__(initial_lr, multiplier, start_epoch=0, end_epoch=warmup_epochs, staircase=False,
                         momentum_correction=momentum_correction, steps_per_epoch=steps_per_epoch)
        self.verbose = verbose

    def on_epoch_end(self, epoch, logs=None):
        super().on_epoch_end(epoch, logs)
        if epoch == self.end_epoch - 1 and self.verbose > 0 and basics.rank() == 0:
            print(f"\nEpoch {epoch + 1}: finished gradual learning rate warmup to "
                  f"{_get_value(self._optimizer().learning_rate):g}.")
