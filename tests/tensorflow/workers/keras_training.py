"""What the Keras training workers (tf_train_worker.py for Keras 3, keras2_worker.py for Keras 2)
share: their data, their model (built with whichever Keras module they pass), each rank's rows of a
batch, and the checks on weights."""
import random

import numpy as np
import tensorflow as tf

import collectives.tensorflow as hvd


def data(n, seed=0, features=6, outputs=2):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, features)).astype(np.float32)
    y = np.tanh(x @ rng.normal(size=(features, outputs))).astype(np.float32)
    return x, y


def seed_all(keras, seed):
    """``keras.utils.set_random_seed(seed)``, except for tf_keras: there it seeds what that seeds
    (Python's, numpy's and TensorFlow's generators) but not the seed generator it also installs,
    which tf-keras 2.18 calls as ``randint(1, 1e9)``, a TypeError on Python 3.12 and newer (seen in
    docs/compatibility.md's matrix). Unseeded tf_keras initializers draw from Python's generator."""
    if keras.__name__.startswith("tf_keras") or keras.Model.__module__.startswith("tf_keras"):
        random.seed(seed)
        np.random.seed(seed)
        tf.random.set_seed(seed)
    else:
        keras.utils.set_random_seed(seed)


def mlp(keras, seed=0, features=6, outputs=2):
    """A small MLP of ``keras`` (Keras 3's module or tf_keras), seeded alike on every rank."""
    seed_all(keras, seed)
    return keras.Sequential([keras.Input((features,)), keras.layers.Dense(8, activation="tanh"),
                             keras.layers.Dense(outputs)])


def rank_rows(x, chunk):
    """This rank's share of every consecutive block of size*chunk rows (block j's rows
    [j*size*chunk + rank*chunk, ... + chunk)), in order."""
    blocks = x.reshape(-1, hvd.size(), chunk, *x.shape[1:])
    return blocks[:, hvd.rank()].reshape(-1, *x.shape[1:])


def assert_weights_close(a, b, rtol=1e-5, atol=1e-6, what=""):
    assert len(a) == len(b), (len(a), len(b))
    for i, (p, q) in enumerate(zip(a, b)):
        np.testing.assert_allclose(np.asarray(p), np.asarray(q), rtol=rtol, atol=atol, err_msg=f"{what} weight {i}")


def assert_same_on_all_ranks(weights, what):
    mine = [np.asarray(w) for w in weights]
    for a, b in zip(mine, hvd.broadcast_object(mine, root_rank=0)):
        np.testing.assert_array_equal(a, b, err_msg=f"{what}: rank {hvd.rank()} differs from rank 0")
