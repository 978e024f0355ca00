"""Horovod's examples/tensorflow2/tensorflow2_keras_mnist.py (written for Keras 2), unchanged
except the import line, the data (synthetic MNIST-shaped images instead of a download) and the
sizes (a few steps); the checkpoint callback writes into ``workdir``. Run with
``TF_USE_LEGACY_KERAS=1``, where ``tf.keras`` is tf_keras."""
import os

import numpy as np
import tensorflow as tf

import collectives.keras as hvd


def synthetic_mnist(rank, n=256):
    rng = np.random.default_rng(rank)
    labels = rng.integers(0, 10, size=n).astype(np.uint8)
    images = rng.integers(0, 60, size=(n, 28, 28)).astype(np.uint8)
    for i, label in enumerate(labels):  # a bright block whose place is the label: learnable
        images[i, 2 * label:2 * label + 6, 4:24] = 250
    return (images, labels), None


def train(workdir, epochs=2, steps=8):
    # Horovod: initialize Horovod.
    hvd.init()

    # Horovod: pin GPU to be used to process local rank (one GPU per process)
    gpus = tf.config.experimental.list_physical_devices('GPU')
    for gpu in gpus:
        tf.config.experimental.set_memory_growth(gpu, True)
    if gpus:
        tf.config.experimental.set_visible_devices(gpus[hvd.local_rank()], 'GPU')

    (mnist_images, mnist_labels), _ = synthetic_mnist(hvd.rank())

    dataset = tf.data.Dataset.from_tensor_slices(
        (tf.cast(mnist_images[..., tf.newaxis] / 255.0, tf.float32),
                 tf.cast(mnist_labels, tf.int64))
    )
    dataset = dataset.repeat().shuffle(10000).batch(32)

    mnist_model = tf.keras.Sequential([
        tf.keras.layers.Conv2D(4, [3, 3], activation='relu'),
        tf.keras.layers.MaxPooling2D(pool_size=(2, 2)),
        tf.keras.layers.Dropout(0.25),
        tf.keras.layers.Flatten(),
        tf.keras.layers.Dense(16, activation='relu'),
        tf.keras.layers.Dense(10, activation='softmax')
    ])

    # Horovod: adjust learning rate based on number of GPUs.
    scaled_lr = 0.01 * hvd.size()
    opt = tf.optimizers.Adam(scaled_lr)

    # Horovod: add Horovod DistributedOptimizer.
    opt = hvd.DistributedOptimizer(
        opt, backward_passes_per_step=1, average_aggregated_gradients=True)

    # Horovod: Specify `experimental_run_tf_function=False` to ensure TensorFlow
    # uses hvd.DistributedOptimizer() to compute gradients.
    mnist_model.compile(loss=tf.losses.SparseCategoricalCrossentropy(),
                        optimizer=opt,
                        metrics=['accuracy'],
                        experimental_run_tf_function=False)

    callbacks = [
        # Horovod: broadcast initial variable states from rank 0 to all other processes.
        hvd.callbacks.BroadcastGlobalVariablesCallback(0),

        # Horovod: average metrics among workers at the end of every epoch.
        hvd.callbacks.MetricAverageCallback(),

        # Horovod: scale the learning rate during the first epoch.
        hvd.callbacks.LearningRateWarmupCallback(initial_lr=scaled_lr, warmup_epochs=1, verbose=1),
    ]

    # Horovod: save checkpoints only on worker 0 to prevent other workers from corrupting them.
    if hvd.rank() == 0:
        callbacks.append(tf.keras.callbacks.ModelCheckpoint(os.path.join(workdir, 'checkpoint-{epoch}.h5')))

    # Horovod: write logs on worker 0.
    verbose = 1 if hvd.rank() == 0 else 0

    # Train the model.
    history = mnist_model.fit(dataset, steps_per_epoch=steps, callbacks=callbacks, epochs=epochs, verbose=verbose)

    # Return the model
    return mnist_model, history
