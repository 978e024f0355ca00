"""Horovod's TensorFlow 2 MNIST recipe on collectives (a GradientTape loop), with MNIST-shaped
synthetic data (no download).

    .venv/bin/mpirun -np 2 .venv/bin/python examples/tensorflow_mnist.py [--epochs 3]

Each 28x28 image is noise plus a bright 7x5 patch whose position (one of 10 cells) is the
label, so a small CNN learns it in a few epochs. The recipe: init, size TensorFlow's thread
pools to this rank's share of the cores, shard the data by rank, scale the learning rate by
the number of ranks, wrap the tape in DistributedGradientTape, broadcast the variables from
rank 0 after the first step (when the optimizer's variables exist), and average the metrics
over ranks with allreduce.
"""
import argparse
import os
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import collectives.tensorflow as hvd  # noqa: E402


def synthetic_mnist(n, seed):
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, 10, size=n)
    images = (0.3 * rng.standard_normal((n, 28, 28, 1))).astype(np.float32)
    for c in range(10):
        row, col = divmod(c, 5)
        r0, c0 = 3 + row * 14, 1 + col * 5
        images[labels == c, r0:r0 + 7, c0:c0 + 5, :] += 1.0
    return images, labels.astype(np.int64)


def make_model():
    return tf.keras.Sequential([
        tf.keras.Input((28, 28, 1)),
        tf.keras.layers.Conv2D(8, 5, activation="relu"),
        tf.keras.layers.MaxPooling2D(),
        tf.keras.layers.Conv2D(16, 5, activation="relu"),
        tf.keras.layers.MaxPooling2D(),
        tf.keras.layers.Flatten(),
        tf.keras.layers.Dense(64, activation="relu"),
        tf.keras.layers.Dense(10),
    ])


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--lr", type=float, default=0.01)
    parser.add_argument("--train-size", type=int, default=4096)
    args = parser.parse_args()

    hvd.init()
    # The ranks share the machine: give each its share of the cores (before TF's first op).
    threads = max(1, (os.cpu_count() or 1) // hvd.local_size())
    tf.config.threading.set_intra_op_parallelism_threads(threads)
    tf.config.threading.set_inter_op_parallelism_threads(threads)
    tf.keras.utils.set_random_seed(42 + hvd.rank())  # different on purpose: the broadcast fixes it

    images, labels = synthetic_mnist(args.train_size, seed=0)
    test_images, test_labels = synthetic_mnist(1024, seed=1)
    # Each rank trains on its own shard.
    images, labels = images[hvd.rank()::hvd.size()], labels[hvd.rank()::hvd.size()]
    test_images, test_labels = test_images[hvd.rank()::hvd.size()], test_labels[hvd.rank()::hvd.size()]

    model = make_model()
    loss_fn = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    optimizer = tf.keras.optimizers.SGD(args.lr * hvd.size(), momentum=0.5)

    @tf.function
    def training_step(x, y, first_batch):
        with tf.GradientTape() as tape:
            loss = loss_fn(y, model(x, training=True))
        tape = hvd.DistributedGradientTape(tape)  # gradients averaged over the ranks
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables))
        if first_batch:
            # After the first step, so that the optimizer's variables exist too.
            hvd.broadcast_variables(model.variables, root_rank=0)
            hvd.broadcast_variables(optimizer.variables, root_rank=0)
        return loss

    start = time.perf_counter()
    first = True
    for epoch in range(1, args.epochs + 1):
        perm = np.random.default_rng(epoch).permutation(len(images))
        total, batches = 0.0, 0
        for i in range(0, len(images) - args.batch_size + 1, args.batch_size):
            idx = perm[i:i + args.batch_size]
            loss = training_step(images[idx], labels[idx], first)
            first = False
            total, batches = total + float(loss), batches + 1
        train_loss = float(hvd.allreduce(tf.constant(total / batches), name="avg_train_loss"))

        logits = model(test_images, training=False)
        test_loss = float(hvd.allreduce(loss_fn(test_labels, logits), name="avg_test_loss"))
        correct = tf.reduce_mean(tf.cast(tf.equal(tf.argmax(logits, 1), test_labels), tf.float32))
        accuracy = float(hvd.allreduce(correct, name="avg_accuracy"))
        if hvd.rank() == 0:
            print(f"epoch {epoch}: train loss {train_loss:.4f}  test loss {test_loss:.4f}  "
                  f"accuracy {100 * accuracy:.1f}%  ({time.perf_counter() - start:.1f} s, {hvd.size()} ranks)",
                  flush=True)
    hvd.shutdown()


if __name__ == "__main__":
    main()
