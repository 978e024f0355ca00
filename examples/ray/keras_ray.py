"""Keras training on Ray with collectives.ray.RayExecutor (Horovod's RayExecutor API).

    python examples/ray/keras_ray.py --num-workers 2               # a local Ray on this machine
    python examples/ray/keras_ray.py --address auto --num-workers 4  # a cluster

Synthetic data (no download); ``collectives.keras.DistributedOptimizer`` averages the gradients
of model.fit over the ranks, and rank 0's initial weights are broadcast first.
"""
import argparse

import ray

from collectives.ray import RayExecutor


def train(epochs, lr):
    import numpy as np
    import keras
    import collectives.keras as hvd
    hvd.init()  # the rank's engine is started already: a no-op, kept as in Horovod scripts
    rng = np.random.default_rng(hvd.rank())
    x = rng.normal(size=(256, 8)).astype("float32")
    y = (x @ np.arange(8.0, dtype="float32"))[:, None]
    model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(16, activation="relu"), keras.layers.Dense(1)])
    model.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.SGD(lr * hvd.size())), loss="mse")
    history = model.fit(x, y, batch_size=32, epochs=epochs, verbose=0,
                        callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0)])
    return hvd.rank(), history.history["loss"][-1]


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--address", default=None)
    p.add_argument("--num-workers", type=int, default=2)
    p.add_argument("--epochs", type=int, default=5)
    p.add_argument("--lr", type=float, default=0.001)
    a = p.parse_args()
    ray.init(address=a.address)
    executor = RayExecutor(RayExecutor.create_settings(timeout_s=120), num_workers=a.num_workers)
    executor.start()
    try:
        for rank, loss in executor.run(train, args=[a.epochs, a.lr]):
            print(f"rank {rank}: final loss {loss:.4f}")
    finally:
        executor.shutdown()


if __name__ == "__main__":
    main()
