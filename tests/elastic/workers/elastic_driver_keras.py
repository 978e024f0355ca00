"""Horovod-style elastic Keras training under the elastic driver (tests/elastic/test_elastic_driver.py).

A two-layer model fitted with ``model.fit`` on synthetic data, ``hvd.elastic.KerasState`` and
Horovod's callbacks (UpdateBatchStateCallback, UpdateEpochStateCallback, CommitStateCallback
every COMMIT_EVERY batches). A callback of ours counts the finished batches of each epoch in the
state (committed with it), so the end can check that every epoch ran exactly STEPS batches across
the restarts, as an uninterrupted run does. Keras 3's ``fit`` runs ``steps_per_epoch`` batches
whatever UpdateBatchStateCallback does to ``params['steps']``, so the rest of an epoch that a
restart cut short is fitted on its own (``steps_per_epoch=STEPS - done``).

Each rank prints ``RESULT {json}`` at the end: its weights, the epochs and the batches per epoch.
Progress lines (``[gen G rank R/S] ...``) go to stderr.

--die-rank R --die-generation G [G ...] --die-step S: rank R SIGKILLs itself before its S-th
batch (counted from the start of generation G) in each generation G. --step-sleep: seconds per
batch. --zero-stage Z: DistributedOptimizer(zero_stage=Z), the optimizer state sharded over the
ranks (tests/elastic/test_elastic_zero_keras.py). A fit resumed mid-epoch skips the batches the
commit has done, so a restarted run sees the batches an uninterrupted one does.
"""
import argparse
import json
import os
import signal
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import collectives.keras as hvd  # noqa: E402

STEPS = 6  # batches per epoch, whatever the size (Horovod's Keras recipe)
EPOCHS = 2
BATCH = 8
COMMIT_EVERY = 2
FEATURES = 4
HIDDEN = 20


def log(text):
    print(f"[gen {os.environ.get('COLLECTIVES_ELASTIC_GENERATION', '-')} rank {hvd.rank()}/{hvd.size()}] {text}",
          file=sys.stderr, flush=True)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--die-rank", type=int, default=-1)
    p.add_argument("--die-generation", type=int, nargs="+", default=[0])
    p.add_argument("--die-step", type=int, default=-1)
    p.add_argument("--step-sleep", type=float, default=0.05)
    p.add_argument("--zero-stage", type=int, default=0)
    a = p.parse_args()
    generation = int(os.environ.get("COLLECTIVES_ELASTIC_GENERATION", "0"))

    hvd.init()
    tf.config.threading.set_intra_op_parallelism_threads(1)
    tf.config.threading.set_inter_op_parallelism_threads(1)
    keras.utils.set_random_seed(0)
    rng = np.random.default_rng(100 + hvd.rank())
    x = rng.standard_normal((STEPS * BATCH, FEATURES)).astype(np.float32)
    y = (x @ np.array([[1.0], [-2.0], [0.5], [3.0]], dtype=np.float32)).astype(np.float32)
    dataset = tf.data.Dataset.from_tensor_slices((x, y)).repeat().batch(BATCH)

    # HIDDEN units: 121 weights, so every rank holds a real slice of a sharded state at 2 and 3 ranks.
    model = keras.Sequential([keras.Input((FEATURES,)), keras.layers.Dense(HIDDEN, activation="tanh"),
                              keras.layers.Dense(1)])
    optimizer = hvd.DistributedOptimizer(keras.optimizers.SGD(learning_rate=0.02 * hvd.size(), momentum=0.5),
                                         zero_stage=a.zero_stage)
    model.compile(loss="mse", optimizer=optimizer)
    state = hvd.elastic.KerasState(model, batch=0, epoch=0, batches=[0] * EPOCHS)

    class CountAndMaybeDie(keras.callbacks.Callback):
        """Counts the epoch's finished batches into the state (before the commit callback)."""

        def __init__(self):
            super().__init__()
            self.steps_here = 0

        def on_train_batch_begin(self, batch, logs=None):
            if generation in a.die_generation and hvd.rank() == a.die_rank and self.steps_here == a.die_step:
                log("killing myself with SIGKILL")
                os.kill(os.getpid(), signal.SIGKILL)

        def on_train_batch_end(self, batch, logs=None):
            state.batches[state.epoch] += 1
            self.steps_here += 1
            time.sleep(a.step_sleep)

    callbacks = [hvd.elastic.UpdateBatchStateCallback(state), CountAndMaybeDie(),
                 hvd.elastic.UpdateEpochStateCallback(state),
                 hvd.elastic.CommitStateCallback(state, batches_per_commit=COMMIT_EVERY)]

    @hvd.elastic.run
    def train(state):
        log(f"start: commit {state.commit_id}, epoch {state.epoch}, batch {state.batch}, "
            f"samples done {sum(state.batches) * BATCH}")
        while state.epoch < EPOCHS:
            # Keras 3 runs steps_per_epoch batches whatever UpdateBatchStateCallback says, so the
            # rest of an epoch cut short by a restart is fitted on its own, one epoch per fit.
            done = state.batches[state.epoch]
            state.model.fit(dataset.skip(done), steps_per_epoch=STEPS - done, epochs=1,
                            callbacks=callbacks, verbose=0, shuffle=False)

    train(state)
    weights = np.concatenate([np.asarray(w).ravel() for w in model.get_weights()]).astype(np.float64)
    print("RESULT " + json.dumps({"rank": hvd.rank(), "size": hvd.size(), "generation": generation,
                                  "weights": weights.tolist(), "epoch": state.epoch, "batches": state.batches,
                                  "commit": state.commit_id}), flush=True)


if __name__ == "__main__":
    main()
