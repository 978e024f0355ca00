"""op=Adasum in collectives.tensorflow / collectives.keras on real ranks (run under mpirun),
checked against the numpy reference of adasum_reference.py.

  - allreduce / grouped_allreduce with op=Adasum, eagerly and in tf.function (float16,
    float32, float64), and the gradient of allreduce (the Adasum of the upstream gradients);
  - DistributedGradientTape(op=Adasum), as Horovod's tape: the gradients are combined with
    Adasum (each tensor on its own); three SGD steps of a linear model against numpy, eagerly
    and in tf.function;
  - Horovod's refusals: DistributedOptimizer of a Keras optimizer with op=Adasum (both faces)
    raises ValueError, sparse gradients with Adasum raise NotImplementedError.
"""
import numpy as np
import tensorflow as tf

import collectives.keras as hvd_keras
import collectives.tensorflow as hvd
from adasum_reference import TOLERANCE, adasum, assert_close
from common import Checker

hvd.init()
R, S = hvd.rank(), hvd.size()
chk = Checker(R)
W0 = np.array([[0.5, -0.2], [0.1, 0.3], [0.8, -0.6]])  # 3 features -> 2 outputs
B0 = np.array([0.05, -0.1])


def rank_vector(seed, rank, shape, dtype):
    rng = np.random.default_rng([seed, rank])
    return (rng.standard_normal(shape) + 0.3 * (rank + 1)).astype(dtype)


def verbs():
    for d, dtype in enumerate((np.float16, np.float32, np.float64)):
        dt = np.dtype(dtype)
        mine = rank_vector(300 + d, R, (13,), dt)
        want = adasum([rank_vector(300 + d, r, (13,), dt) for r in range(S)], dt)
        got = hvd.allreduce(tf.constant(mine), op=hvd.Adasum, name=f"tf.{dt}")
        assert got.dtype == tf.as_dtype(dt)
        assert_close(got.numpy(), want, TOLERANCE[dt], f"eager {dt}")
        fn = tf.function(lambda t: hvd.allreduce(t, op=hvd.Adasum, name=f"tf.fn.{dt}"))
        assert_close(fn(tf.constant(mine)).numpy(), want, TOLERANCE[dt], f"tf.function {dt}")
    sizes = (2, 20, 200)
    group = [tf.constant(rank_vector(310 + k, R, (n,), np.float32)) for k, n in enumerate(sizes)]
    got = hvd.grouped_allreduce(group, op=hvd.Adasum, name="tf.group")
    for k, n in enumerate(sizes):
        want = adasum([rank_vector(310 + k, r, (n,), np.float32) for r in range(S)], np.float32)
        assert_close(got[k].numpy(), want, TOLERANCE[np.dtype(np.float32)], f"group {k}")


def gradient():
    x = tf.Variable(rank_vector(320, R, (6,), np.float64))
    upstream = rank_vector(321, R, (6,), np.float64)
    with tf.GradientTape() as tape:
        y = hvd.allreduce(x, op=hvd.Adasum, name="tf.grad")
    grad = tape.gradient(y, x, output_gradients=tf.constant(upstream))
    assert_close(grad.numpy(), adasum([rank_vector(321, r, (6,), np.float64) for r in range(S)]), 1e-13, "gradient")


def batch(step, rank, n=4):
    rng = np.random.default_rng([23, step, rank])
    return rng.standard_normal((n, 3)), rng.standard_normal((n, 2))


def numpy_grads(w, b, x, y):
    """Gradients of mean((x @ w + b - y)^2) over every element."""
    err = x @ w + b - y
    scale = 2.0 / err.size
    return scale * x.T @ err, scale * err.sum(axis=0)


def tape_training(in_function):
    lr, steps = 0.1, 3
    w, b = tf.Variable(W0), tf.Variable(B0)

    def step(x, y):
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.square(x @ w + b - y))
        tape = hvd.DistributedGradientTape(tape, op=hvd.Adasum)
        gw, gb = tape.gradient(loss, [w, b])
        w.assign_sub(lr * gw)
        b.assign_sub(lr * gb)

    run = tf.function(step) if in_function else step
    ref_w, ref_b = W0.copy(), B0.copy()
    for s in range(steps):
        run(*(tf.constant(a) for a in batch(s, R)))
        per_rank = [numpy_grads(ref_w, ref_b, *batch(s, r)) for r in range(S)]
        ref_w = ref_w - lr * adasum([g[0] for g in per_rank])
        ref_b = ref_b - lr * adasum([g[1] for g in per_rank])
    assert_close(w.numpy(), ref_w, 1e-12, "W")
    assert_close(b.numpy(), ref_b, 1e-12, "b")


def expect(exc_type, fn, *words):
    try:
        fn()
    except exc_type as e:
        for word in words:
            assert word in str(e), f"{word!r} not in {e}"
        return
    raise AssertionError(f"no {exc_type.__name__} raised")


def refusals():
    import keras

    expect(ValueError, lambda: hvd.DistributedOptimizer(keras.optimizers.SGD(0.1), op=hvd.Adasum), "Adasum")
    expect(ValueError, lambda: hvd_keras.DistributedOptimizer(keras.optimizers.SGD(0.1), op=hvd_keras.Adasum), "Adasum")
    table = tf.Variable(np.ones((5, 2)))

    def sparse_step():
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(tf.gather(table, [0, 3]))
        tape = hvd.DistributedGradientTape(tape, op=hvd.Adasum)
        return tape.gradient(loss, [table])

    expect(NotImplementedError, sparse_step, "sparse_as_dense=True")


chk.check("allreduce / grouped_allreduce", verbs)
chk.check("allreduce gradient", gradient)
chk.check("DistributedGradientTape eager", lambda: tape_training(False))
chk.check("DistributedGradientTape tf.function", lambda: tape_training(True))
chk.check("Horovod's refusals", refusals)
chk.finish()
