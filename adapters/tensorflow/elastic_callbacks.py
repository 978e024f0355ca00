"""Horovod's elastic Keras callbacks: commit every N batches, keep ``state.batch`` and
``state.epoch`` up to date (for the ``fit`` of Keras 3 and of Keras 2: keras_callback_base.py)."""
from .keras_callback_base import CollectivesCallback


class CommitStateCallback(CollectivesCallback):
    """Commit ``state`` after every ``batches_per_commit`` batches and at the end of each epoch."""

    def __init__(self, state, batches_per_commit=1):
        super().__init__()
        self.state = state
        self.batches_per_commit = batches_per_commit
        self.batches_remaining = batches_per_commit

    def on_train_begin(self, logs=None):
        self.batches_remaining = self.batches_per_commit  # the same count on every rank after a reset

    def on_batch_end(self, batch, logs=None):
        self.batches_remaining -= 1
        if self.batches_remaining == 0:
            self.commit()
            self.batches_remaining = self.batches_per_commit

    def on_epoch_end(self, epoch, logs=None):
        self.commit()

    def commit(self):
        self.state.commit()


class UpdateBatchStateCallback(CollectivesCallback):
    """``state.batch`` = the last finished batch of the epoch (0 again at the epoch's end);
    ``params['steps']`` shows the steps left in an epoch resumed midway, as Horovod's does."""

    def __init__(self, state):
        super().__init__()
        self.state = state
        self.steps_per_epoch = None

    def on_train_begin(self, logs=None):
        self.steps_per_epoch = None

    def on_epoch_begin(self, epoch, logs=None):
        params = self.params or {}
        if params.get("steps"):
            if self.steps_per_epoch is None:
                self.steps_per_epoch = params["steps"]
            params["steps"] = self.steps_per_epoch - self.state.batch

    def on_batch_end(self, batch, logs=None):
        self.state.batch = batch

    def on_epoch_end(self, epoch, logs=None):
        self.state.batch = 0


class UpdateEpochStateCallback(CollectivesCallback):
    """``state.epoch`` = epochs finished in total, over resets (Keras counts from 0 in each
    ``fit``: pass ``epochs=total - state.epoch``)."""

    def __init__(self, state):
        super().__init__()
        self.state = state
        self.initial_epoch = self.state.epoch

    def on_train_begin(self, logs=None):
        self.initial_epoch = self.state.epoch

    def on_epoch_end(self, epoch, logs=None):
        # +1: a reset after this epoch must not repeat it.
        self.state.epoch = self.initial_epoch + epoch + 1
