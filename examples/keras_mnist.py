"""Horovod's Keras MNIST recipe on collectives (model.fit), with MNIST-shaped synthetic data
(no download).

    .venv/bin/mpirun -np 2 .venv/bin/python examples/keras_mnist.py [--epochs 3]

The recipe: init, size TensorFlow's thread pools to this rank's share of the cores, shard
the data by rank, scale the learning rate by the number of ranks, wrap the optimizer in
DistributedOptimizer, and fit with the callbacks that broadcast the initial variables from
rank 0, average the epoch's metrics over the ranks and warm the learning rate up. The final
evaluation is averaged over the ranks with allreduce.
"""
import argparse
import os
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import collectives.keras as hvd  # noqa: E402


def synthetic_mnist(n, seed):
    """Noise plus a bright 7x5 patch whose position (one of 10 cells) is the label."""
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, 10, size=n)
    images = (0.3 * rng.standard_normal((n, 28, 28, 1))).astype(np.float32)
    for c in range(10):
        row, col = divmod(c, 5)
        r0, c0 = 3 + row * 14, 1 + col * 5
        images[labels == c, r0:r0 + 7, c0:c0 + 5, :] += 1.0
    return images, labels.astype(np.int64)


def make_model():
    return keras.Sequential([
        keras.Input((28, 28, 1)),
        keras.layers.Conv2D(8, 5, activation="relu"),
        keras.layers.MaxPooling2D(),
        keras.layers.Conv2D(16, 5, activation="relu"),
        keras.layers.MaxPooling2D(),
        keras.layers.Flatten(),
        keras.layers.Dense(64, activation="relu"),
        keras.layers.Dense(10),
    ])


class PrintEpoch(keras.callbacks.Callback):
    """Rank 0 prints the epoch's metrics (already averaged by MetricAverageCallback)."""

    def __init__(self):
        super().__init__()
        self.start = time.perf_counter()

    def on_epoch_end(self, epoch, logs=None):
        if hvd.rank() == 0:
            print(f"epoch {epoch + 1}: train loss {logs['loss']:.4f}  train accuracy {100 * logs['accuracy']:.1f}%  "
                  f"val loss {logs['val_loss']:.4f}  val accuracy {100 * logs['val_accuracy']:.1f}%  "
                  f"lr {logs['lr']:.4f}  ({time.perf_counter() - self.start:.1f} s, {hvd.size()} ranks)",
                  flush=True)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--lr", type=float, default=0.01)
    parser.add_argument("--train-size", type=int, default=4096)
    args = parser.parse_args()

    hvd.init()
    threads = max(1, (os.cpu_count() or 1) // hvd.local_size())
    tf.config.threading.set_intra_op_parallelism_threads(threads)
    tf.config.threading.set_inter_op_parallelism_threads(threads)
    keras.utils.set_random_seed(42 + hvd.rank())  # different on purpose: the broadcast fixes it

    images, labels = synthetic_mnist(args.train_size, seed=0)
    test_images, test_labels = synthetic_mnist(1024, seed=1)
    images, labels = images[hvd.rank()::hvd.size()], labels[hvd.rank()::hvd.size()]
    test_images, test_labels = test_images[hvd.rank()::hvd.size()], test_labels[hvd.rank()::hvd.size()]

    model = make_model()
    optimizer = hvd.DistributedOptimizer(keras.optimizers.SGD(args.lr * hvd.size(), momentum=0.5))
    model.compile(optimizer=optimizer, loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  metrics=["accuracy"])
    callbacks = [
        hvd.callbacks.BroadcastGlobalVariablesCallback(0),  # same initial weights everywhere
        hvd.callbacks.MetricAverageCallback(),  # before the callbacks that read the metrics
        hvd.callbacks.LearningRateWarmupCallback(initial_lr=args.lr * hvd.size(), warmup_epochs=1,
                                                 momentum_correction=False),
        PrintEpoch(),
    ]
    model.fit(images, labels, batch_size=args.batch_size, epochs=args.epochs, verbose=0,
              validation_data=(test_images, test_labels), callbacks=callbacks)

    loss, accuracy = model.evaluate(test_images, test_labels, verbose=0)
    loss = float(hvd.allreduce(loss, name="final_loss"))
    accuracy = float(hvd.allreduce(accuracy, name="final_accuracy"))
    if hvd.rank() == 0:
        print(f"final: test loss {loss:.4f}  accuracy {100 * accuracy:.1f}% (averaged over {hvd.size()} ranks)",
              flush=True)
    hvd.shutdown()


if __name__ == "__main__":
    main()
