"""collectives.tensorflow.SyncBatchNormalization against numpy batch normalization over the
concatenated batches of all ranks (run under mpirun, one process per rank).

Every rank recomputes every rank's input, builds the numpy reference on the whole batch and
checks its own share: outputs, moving mean and variance (Keras' momentum rule with the biased
batch variance), and the gradients of the input, gamma and beta for a loss summed over the
ranks -- eagerly and inside tf.function, for equal, uneven and empty shares, 2-D, 4-D
(channels last) and masked 3-D inputs. Also: fused=True refused as in Horovod, and the layer's
config round trip. With the argument ``fit``: model.fit with DistributedOptimizer equals one
process training plain BatchNormalization on the whole batch.
"""
import faulthandler
import sys

# A hang prints every thread's stack (then exits) well before the test's hard timeout kills the job.
faulthandler.enable(file=sys.stderr)
faulthandler.dump_traceback_later(180, exit=True, file=sys.stderr)

import numpy as np  # noqa: E402

import collectives.tensorflow as hvd  # noqa: E402

hvd.init()

import keras  # noqa: E402
import tensorflow as tf  # noqa: E402

from common import Checker, rank_input  # noqa: E402

R, S = hvd.rank(), hvd.size()
chk = Checker(R)
EPS, MOMENTUM = 1e-3, 0.9
MODES = ("eager", "function")


def share(seed, rank, rows, inner):
    """Rank ``rank``'s input: small integers shifted by the rank, so the ranks' means differ."""
    return rank_input(seed, rank, (rows,) + inner, np.float32) + 3.0 * rank


def upstream(seed, rank, shape):
    return rank_input(seed + 1000, rank, shape, np.float32) / 4.0


def reference(xs, dys, gamma, beta, axes, masks=None):
    """Batch norm over the concatenation of ``xs`` (numpy): per rank, the outputs and the input
    gradients; the batch mean and variance; and this rank's own share of dgamma and dbeta."""
    x = np.concatenate(xs).astype(np.float64)
    dy = np.concatenate(dys).astype(np.float64)
    w = np.ones(x.shape[:-1] + (1,)) if masks is None else np.concatenate(masks)[..., None].astype(np.float64)
    w = np.broadcast_to(w, x.shape)
    n = w.sum(axis=axes)
    mean = (w * x).sum(axis=axes) / n
    var = (w * (x - mean) ** 2).sum(axis=axes) / n
    inv = 1.0 / np.sqrt(var + EPS)
    xhat = (x - mean) * inv
    y = gamma * xhat + beta
    # Backward of y = gamma * xhat + beta: every element is normalized (its upstream gradient
    # reaches the statistics), but only the weighted ones moved them.
    g = dy * gamma
    mean_g = g.sum(axis=axes) / n
    mean_gx = (g * xhat).sum(axis=axes) / n
    dx = inv * (g - w * (mean_g + xhat * mean_gx))
    offsets = np.cumsum([0] + [len(a) for a in xs])
    mine = slice(offsets[R], offsets[R + 1])
    dgamma = (dy * xhat)[mine].sum(axis=axes)
    dbeta = dy[mine].sum(axis=axes)
    return y[mine], dx[mine], mean, var, dgamma, dbeta


def run_case(label, seed, rows, inner, with_mask=False, modes=MODES):
    axes = tuple(range(1 + len(inner) - 1))  # every axis but the channels (the last)
    channels = inner[-1]
    xs = [share(seed, r, rows[r], inner) for r in range(S)]
    dys = [upstream(seed, r, xs[r].shape) for r in range(S)]
    masks = None
    if with_mask:
        masks = [rank_input(seed + 7, r, xs[r].shape[:-1], np.bool_) for r in range(S)]
    gamma = np.linspace(0.5, 1.5, channels).astype(np.float32)
    beta = np.linspace(-1.0, 1.0, channels).astype(np.float32)
    y_ref, dx_ref, mean, var, dgamma_ref, dbeta_ref = reference(xs, dys, gamma, beta, axes, masks)

    for mode in modes:
        def case(mode=mode):
            layer = hvd.SyncBatchNormalization(momentum=MOMENTUM, epsilon=EPS)
            layer.build(xs[R].shape)
            layer.gamma.assign(gamma)
            layer.beta.assign(beta)
            x = tf.constant(xs[R])
            dy = tf.constant(dys[R])
            mask = None if masks is None else tf.constant(masks[R])

            def step(x, dy):
                with tf.GradientTape() as tape:
                    tape.watch(x)
                    y = layer(x, training=True, mask=mask)
                    loss = tf.reduce_sum(y * dy)
                dx, dgamma, dbeta = tape.gradient(loss, [x, layer.gamma, layer.beta])
                return y, dx, dgamma, dbeta

            fn = step if mode == "eager" else tf.function(step)
            y, dx, dgamma, dbeta = fn(x, dy)
            tol = dict(rtol=1e-4, atol=1e-4)
            # (with a mask, every element is normalized; the statistics come from the unmasked ones)
            np.testing.assert_allclose(y.numpy(), y_ref, **tol)
            np.testing.assert_allclose(layer.moving_mean.numpy(), (1 - MOMENTUM) * mean, **tol)
            np.testing.assert_allclose(layer.moving_variance.numpy(), MOMENTUM + (1 - MOMENTUM) * var, **tol)
            np.testing.assert_allclose(dx.numpy(), dx_ref, **tol)
            np.testing.assert_allclose(dgamma.numpy(), dgamma_ref, **tol)
            np.testing.assert_allclose(dbeta.numpy(), dbeta_ref, **tol)
        chk.check(f"{label} [{mode}]", case)


def training_matches_one_process():
    """model.fit with SyncBatchNormalization and DistributedOptimizer on each rank's shard equals
    one process training plain BatchNormalization on the concatenated batches (equal shares, so
    Average of the ranks' losses is the loss of the whole batch)."""
    import collectives.keras as hvd_keras

    steps, per_rank = 3, 4
    xs = [rank_input(20, r, (steps * per_rank, 4), np.float32) + r for r in range(S)]
    ys = [rank_input(21, r, (steps * per_rank, 1), np.float32) for r in range(S)]
    # Global batch i is the ranks' batches i, concatenated in rank order.
    gx = np.concatenate([xs[r][i * per_rank:(i + 1) * per_rank] for i in range(steps) for r in range(S)])
    gy = np.concatenate([ys[r][i * per_rank:(i + 1) * per_rank] for i in range(steps) for r in range(S)])

    def model(norm):
        keras.utils.set_random_seed(7)
        return keras.Sequential([keras.Input((4,)), keras.layers.Dense(3), norm(momentum=0.5),
                                 keras.layers.Dense(1)])

    dist = model(hvd.SyncBatchNormalization)
    dist.compile(optimizer=hvd_keras.DistributedOptimizer(keras.optimizers.SGD(0.1)), loss="mse")
    dist.fit(xs[R], ys[R], batch_size=per_rank, shuffle=False, epochs=1, verbose=0)
    single = model(keras.layers.BatchNormalization)
    single.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse")
    single.fit(gx, gy, batch_size=per_rank * S, shuffle=False, epochs=1, verbose=0)
    for got, want in zip(dist.get_weights(), single.get_weights()):
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


def main():
    # Each tf.function traces anew (about a second per case on a busy machine): the function
    # mode runs for the cases whose shapes exercise it most.
    run_case("2-D, equal shares", 1, [4] * S, (3,), modes=("eager",))
    run_case("2-D, uneven shares", 2, [r + 1 for r in range(S)], (3,), modes=("eager",))
    run_case("4-D channels last, uneven shares", 3, [2 + r % 2 for r in range(S)], (3, 2, 4))
    run_case("2-D, rank 0 has an empty share", 4, [0] + [3] * (S - 1), (2,), modes=("eager",))
    run_case("3-D with a mask", 5, [3] * S, (4, 2), with_mask=True)

    if "fit" in sys.argv[1:]:  # the slowest case (two Keras fits): the test runs it at one rank count
        chk.check("model.fit with DistributedOptimizer equals one process on the whole batch",
                  training_matches_one_process)

    def fused_refused():
        for fused in (True, None):
            try:
                hvd.SyncBatchNormalization(fused=fused)
            except ValueError as e:
                assert "fused" in str(e)
            else:
                raise AssertionError(f"fused={fused} accepted")
        hvd.SyncBatchNormalization(fused=False)
    chk.check("fused=True/None raise ValueError (Horovod's rule)", fused_refused)

    def config_round_trip():
        layer = hvd.SyncBatchNormalization(momentum=0.8, epsilon=1e-2, name="sbn")
        again = keras.layers.deserialize(keras.layers.serialize(layer))
        assert type(again) is hvd.SyncBatchNormalization, type(again)
        assert again.momentum == 0.8 and again.epsilon == 1e-2 and again.name == "sbn"
    chk.check("config round trip keeps the class", config_round_trip)

    hvd.shutdown()
    chk.finish()


if __name__ == "__main__":
    main()
