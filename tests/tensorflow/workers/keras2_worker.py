"""collectives.keras and collectives.tensorflow with Keras 2 (tf_keras), on real ranks.

Usage: keras2_worker.py MODE WORKDIR
  MODE env     run with TF_USE_LEGACY_KERAS=1 (tf.keras is tf_keras): every family below
  MODE direct  no variable: ``import tf_keras`` beside Keras 3 (tf.keras); training, callbacks
               and Keras 3 objects in the same process keep Keras 3's wrapper

Families: fit (N ranks on 1/N of each batch reach the weights one process reaches on the
whole batch: new-style SGD-momentum, Adam, RMSprop, legacy SGD and Adam, a custom Optimizer
subclass, backward_passes_per_step=2), custom GradientTape loops (apply_gradients, minimize,
_compute_gradients, get_gradients), every callback, broadcast_variables, load_model of saved
models (.h5, .keras), elastic KerasState, and Horovod's TF2 Keras MNIST example.
"""
import os
import sys

import numpy as np
import tensorflow as tf

import collectives.keras as hvd
import collectives.tensorflow as hvd_tf
from collectives.adapters.tensorflow.keras_flavors import CollectivesOptimizer
from collectives.errors import NotSupportedError
from common import Checker, raises
from keras_training import assert_same_on_all_ranks, assert_weights_close, data
from keras_training import mlp, rank_rows as my_rows

R = S = chk = tfk = WORKDIR = None
MICRO = 4  # rows per rank per micro-batch


def case(label):
    def register(fn):
        chk.check(label, fn)
        return fn
    return register






def make_custom_sgd_class():
    class PlainSGD(tfk.optimizers.Optimizer):
        """A user's own new-style Keras 2 optimizer: var -= lr * grad."""

        def __init__(self, learning_rate=0.1, name="PlainSGD", **kwargs):
            super().__init__(name=name, **kwargs)
            self._learning_rate = self._build_learning_rate(learning_rate)

        def update_step(self, gradient, variable):
            variable.assign_sub(tf.cast(self.learning_rate, variable.dtype) * gradient)

        def get_config(self):
            config = super().get_config()
            config["learning_rate"] = self._serialize_hyperparameter(self._learning_rate)
            return config
    return PlainSGD


# ---------------------------------------------------------------- fit and custom loops

def fit_equivalence(make_opt, passes=1, epochs=1):
    x, y = data(4 * passes * S * MICRO, seed=2)
    model, ref = mlp(tfk), mlp(tfk)
    opt = hvd.DistributedOptimizer(make_opt(), backward_passes_per_step=passes, average_aggregated_gradients=True)
    assert isinstance(opt, type(make_opt())) and isinstance(opt, CollectivesOptimizer)
    model.compile(optimizer=opt, loss="mse")
    # The reference: one process on the whole batch (with passes > 1: on the passes micro-batches
    # of all ranks together, one update of their mean gradient).
    ref.compile(optimizer=make_opt(), loss="mse")
    ref.fit(x, y, batch_size=passes * S * MICRO, epochs=epochs, shuffle=False, verbose=0)
    model.fit(my_rows(x, MICRO), my_rows(y, MICRO), batch_size=MICRO, epochs=epochs, shuffle=False, verbose=0)
    assert_weights_close(model.get_weights(), ref.get_weights(), what="fit vs single process")
    assert int(model.optimizer.iterations) == int(ref.optimizer.iterations)
    assert_same_on_all_ranks(model.get_weights(), "fit")


def loop_equivalence(make_opt, how, in_function=True, steps=3):
    """A custom loop; ``how`` says how the distributed side gets its gradients."""
    x, y = data(steps * S * MICRO, seed=4)
    model, ref = mlp(tfk), mlp(tfk)
    opt, ref_opt = hvd.DistributedOptimizer(make_opt()), make_opt()

    def ref_step(xb, yb):
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.square(ref(xb) - yb))
        ref_opt.apply_gradients(zip(tape.gradient(loss, ref.trainable_variables), ref.trainable_variables))

    def dist_step(xb, yb):
        variables = model.trainable_variables
        if how == "get_gradients":  # legacy, graph-mode style: tf.gradients inside the function
            loss = tf.reduce_mean(tf.square(model(xb) - yb))
            opt.apply_gradients(zip(opt.get_gradients(loss, variables), variables))
            return
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.square(model(xb) - yb))
        if how == "apply_gradients":
            opt.apply_gradients(zip(tape.gradient(loss, variables), variables))
        elif how == "minimize":
            opt.minimize(loss, variables, tape=tape)
        elif how == "_compute_gradients":  # legacy
            opt.apply_gradients(opt._compute_gradients(loss, variables, tape=tape))
        elif how == "compute_gradients":  # new style
            opt.apply_gradients(opt.compute_gradients(loss, variables, tape=tape))

    step = tf.function(dist_step) if in_function else dist_step
    mx, my = my_rows(x, MICRO), my_rows(y, MICRO)
    for s in range(steps):
        ref_step(x[s * S * MICRO:(s + 1) * S * MICRO], y[s * S * MICRO:(s + 1) * S * MICRO])
        step(mx[s * MICRO:(s + 1) * MICRO], my[s * MICRO:(s + 1) * MICRO])
    assert_weights_close(model.get_weights(), ref.get_weights(), what=f"{how} loop vs single process")
    assert_same_on_all_ranks(model.get_weights(), how)


def family_fit_light():
    """The direct-import run: one fit, one custom loop (the env run covers the rest)."""
    O = tfk.optimizers
    case("fit SGD momentum")(lambda: fit_equivalence(lambda: O.SGD(0.05, momentum=0.9)))
    case("custom loop apply_gradients, tf.function, legacy Adam")(
        lambda: loop_equivalence(lambda: O.legacy.Adam(0.01), "apply_gradients"))


def family_fit():
    O = tfk.optimizers
    PlainSGD = make_custom_sgd_class()
    makers = {
        "SGD momentum": lambda: O.SGD(0.05, momentum=0.9),
        "Adam": lambda: O.Adam(0.01),
        "RMSprop": lambda: O.RMSprop(0.01),
        "legacy SGD momentum": lambda: O.legacy.SGD(0.05, momentum=0.9),
        "legacy Adam": lambda: O.legacy.Adam(0.01),
        "custom Optimizer subclass": lambda: PlainSGD(0.1),
    }
    for label, make in makers.items():
        case(f"fit {label}")(lambda make=make: fit_equivalence(make))
    case("fit Adam backward_passes_per_step=2")(lambda: fit_equivalence(makers["Adam"], passes=2))
    case("fit legacy SGD backward_passes_per_step=2")(
        lambda: fit_equivalence(makers["legacy SGD momentum"], passes=2))
    case("custom loop apply_gradients, tf.function, Adam")(lambda: loop_equivalence(makers["Adam"], "apply_gradients"))
    case("custom loop apply_gradients, eager, legacy Adam")(
        lambda: loop_equivalence(makers["legacy Adam"], "apply_gradients", in_function=False))
    case("custom loop minimize(tape=), RMSprop")(lambda: loop_equivalence(makers["RMSprop"], "minimize"))
    case("custom loop compute_gradients, custom subclass")(
        lambda: loop_equivalence(makers["custom Optimizer subclass"], "compute_gradients"))
    case("custom loop _compute_gradients, legacy SGD")(
        lambda: loop_equivalence(makers["legacy SGD momentum"], "_compute_gradients"))
    case("custom loop get_gradients, legacy SGD")(
        lambda: loop_equivalence(makers["legacy SGD momentum"], "get_gradients"))

    @case("DistributedGradientTape with a tf_keras model and optimizer")
    def _():
        x, y = data(MICRO, seed=R)
        model = mlp(tfk)
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.square(model(x) - y))
        grads = hvd_tf.DistributedGradientTape(tape).gradient(loss, model.trainable_variables)
        assert_same_on_all_ranks(grads, "tape gradients")

    @case("collectives.tensorflow.DistributedOptimizer and PartialDistributedOptimizer take tf_keras")
    def _():
        opt = hvd_tf.DistributedOptimizer(O.legacy.SGD(0.1))
        assert isinstance(opt, O.legacy.SGD) and isinstance(opt, CollectivesOptimizer)
        model = mlp(tfk)
        partial = hvd.PartialDistributedOptimizer(O.SGD(0.1), local_layers=[model.layers[0]])
        assert isinstance(partial, O.SGD)

    @case("a wrapped optimizer keeps class name, module and config; bad input is a ValueError")
    def _():
        base = O.Adam(0.003, beta_1=0.8)
        wrapped = hvd.DistributedOptimizer(base)
        assert type(wrapped).__name__ == "Adam" and type(wrapped).__module__ == type(base).__module__
        assert wrapped.get_config() == base.get_config()
        raises(ValueError, lambda: hvd.DistributedOptimizer(wrapped), "already a DistributedOptimizer")
        raises(ValueError, lambda: hvd.DistributedOptimizer(object()), "Keras 2 (tf_keras)")

    @case("zero_stage is refused for tf_keras optimizers (new-style and legacy), on every rank")
    def _():
        for make in (lambda: O.Adam(0.01), lambda: O.legacy.SGD(0.1)):
            raises(NotSupportedError, lambda: hvd.DistributedOptimizer(make(), zero_stage=2),
                   "supported for Keras 3 optimizers only")


def family_keras3_alongside():
    import keras

    @case("a Keras 3 optimizer keeps the Keras 3 wrapper; our callbacks work in its fit too")
    def _():
        from collectives.adapters.tensorflow.keras_optimizer import _DistributedOptimizer
        opt = hvd.DistributedOptimizer(keras.optimizers.SGD(0.0))
        assert isinstance(opt, _DistributedOptimizer) and isinstance(opt, keras.optimizers.SGD)
        keras.utils.set_random_seed(100 + R)
        model = keras.Sequential([keras.Input((6,)), keras.layers.Dense(2)])
        model.compile(optimizer=opt, loss="mse")
        x, y = data(2 * MICRO, seed=R)
        callback = hvd.callbacks.BroadcastGlobalVariablesCallback(0)
        assert isinstance(callback, keras.callbacks.Callback) and isinstance(callback, tfk.callbacks.Callback)
        model.fit(x, y, batch_size=MICRO, epochs=1, verbose=0,
                  callbacks=[callback, hvd.callbacks.MetricAverageCallback()])
        assert_same_on_all_ranks(model.get_weights(), "Keras 3 fit with broadcast (lr 0)")


# ---------------------------------------------------------------- callbacks

def family_callbacks(light=False):
    cb = hvd.callbacks

    class RecordLogs(tfk.callbacks.Callback):
        def __init__(self):
            super().__init__()
            self.epochs, self.lrs = [], []

        def on_epoch_end(self, epoch, logs=None):
            self.epochs.append(dict(logs))

        def on_train_batch_begin(self, batch, logs=None):
            self.lrs.append(float(self.model.optimizer.learning_rate.numpy()))

    @case("BroadcastGlobalVariablesCallback makes differently initialized ranks identical (new and legacy)")
    def _():
        for make in (lambda: tfk.optimizers.SGD(0.0), lambda: tfk.optimizers.legacy.SGD(0.0, momentum=0.5)):
            model = mlp(tfk, seed=100 + R)
            model.compile(optimizer=hvd.DistributedOptimizer(make()), loss="mse")
            x, y = data(2 * MICRO, seed=10 + R)
            callback = cb.BroadcastGlobalVariablesCallback(0)
            assert isinstance(callback, tfk.callbacks.Callback)
            model.fit(x, y, batch_size=MICRO, epochs=1, verbose=0, callbacks=[callback])
            assert_weights_close(model.get_weights(), mlp(tfk, seed=100).get_weights(), 0, 0, "root's initial weights")
            assert_same_on_all_ranks(hvd_tf_optimizer_values(model.optimizer), "optimizer variables")
        assert S == 1 or not np.allclose(mlp(tfk, seed=101).get_weights()[0], mlp(tfk, seed=100).get_weights()[0])

    @case("MetricAverageCallback logs the mean over ranks")
    def _():
        model = mlp(tfk)
        model.compile(optimizer=hvd.DistributedOptimizer(tfk.optimizers.SGD(0.05)), loss="mse", metrics=["mae"])
        x, y = data(2 * MICRO, seed=20 + R)
        before, after = RecordLogs(), RecordLogs()
        history = model.fit(x, y, batch_size=MICRO, epochs=2, verbose=0,
                            callbacks=[before, cb.MetricAverageCallback(), after])
        everyone = hvd.allgather_object([e["loss"] for e in before.epochs])
        assert len({tuple(v) for v in everyone}) == S, "ranks should have different local losses"
        mean = np.mean(np.array(everyone), axis=0)
        np.testing.assert_allclose([e["loss"] for e in after.epochs], mean, rtol=1e-6)
        np.testing.assert_allclose(history.history["loss"], mean, rtol=1e-6)

    if light:
        return

    @case("LearningRateWarmupCallback ramps from lr/size to lr (legacy SGD: momentum corrected)")
    def _():
        model = mlp(tfk)
        model.compile(optimizer=hvd.DistributedOptimizer(tfk.optimizers.legacy.SGD(0.4, momentum=0.9)), loss="mse")
        x, y = data(4 * MICRO, seed=30)
        rec = RecordLogs()
        model.fit(x, y, batch_size=MICRO, epochs=3, verbose=0,
                  callbacks=[cb.LearningRateWarmupCallback(initial_lr=0.4, warmup_epochs=2), rec])
        steps = 4
        expected = [0.4 / S * ((e + (b + 1) / steps) * (S - 1) / 2 + 1) for e in range(2) for b in range(steps)]
        np.testing.assert_allclose(rec.lrs[:8], expected, rtol=1e-6)
        np.testing.assert_allclose(rec.lrs[8:], [expected[-1]] * steps, rtol=1e-6)
        assert "lr" in rec.epochs[0]
        np.testing.assert_allclose(float(model.optimizer.momentum.numpy()), 0.9, rtol=1e-6)  # restored

    @case("LearningRateScheduleCallback staircase multiplier")
    def _():
        model = mlp(tfk)
        model.compile(optimizer=hvd.DistributedOptimizer(tfk.optimizers.SGD(1.0)), loss="mse")
        x, y = data(2 * MICRO, seed=31)
        rec = RecordLogs()
        model.fit(x, y, batch_size=MICRO, epochs=3, verbose=0,
                  callbacks=[cb.LearningRateScheduleCallback(0.2, multiplier=0.5, start_epoch=1), rec])
        np.testing.assert_allclose([e["lr"] for e in rec.epochs], [1.0, 0.1, 0.05], rtol=1e-6)

    @case("elastic callbacks: CommitStateCallback, UpdateBatchStateCallback, UpdateEpochStateCallback")
    def _():
        model = mlp(tfk)
        model.compile(optimizer=hvd.DistributedOptimizer(tfk.optimizers.Adam(0.01)), loss="mse")
        state = hvd.elastic.KerasState(model, batch=0, epoch=0)
        commits = []
        state.register_reset_callbacks([])
        original = state.commit
        state.commit = lambda: (commits.append(1), original())
        x, y = data(4 * MICRO, seed=32 + R)
        batches = []
        rec = tfk.callbacks.LambdaCallback(on_batch_end=lambda b, logs: batches.append(state.batch))
        model.fit(x, y, batch_size=MICRO, epochs=2, verbose=0,
                  callbacks=[hvd.elastic.CommitStateCallback(state, batches_per_commit=2),
                             hvd.elastic.UpdateBatchStateCallback(state), hvd.elastic.UpdateEpochStateCallback(state),
                             rec])
        assert state.epoch == 2 and state.batch == 0, (state.epoch, state.batch)
        assert batches == [0, 1, 2, 3] * 2, batches
        assert len(commits) == 2 * 2 + 2, commits  # every 2 batches, and at each epoch's end
        assert_same_on_all_ranks(model.get_weights(), "elastic callbacks fit")

    @case("BestModelCheckpoint saves the best model in tf_keras' fit")
    def _():
        path = os.path.join(WORKDIR, f"best{R}.keras")
        model = mlp(tfk)
        model.compile(optimizer=hvd.DistributedOptimizer(tfk.optimizers.Adam(0.01)), loss="mse")
        x, y = data(2 * MICRO, seed=33)
        checkpoint = cb.BestModelCheckpoint(monitor="loss", filepath=path)
        history = model.fit(x, y, batch_size=MICRO, epochs=2, verbose=0, callbacks=[checkpoint])
        assert os.path.exists(path) and checkpoint.best == min(history.history["loss"])
        assert isinstance(hvd.load_model(path), tfk.Model)

    @case("mixed_float16: tf_keras' LossScaleOptimizer around the wrapper (new and legacy)")
    def _():
        tfk.mixed_precision.set_global_policy("mixed_float16")
        try:
            for make in (lambda: tfk.optimizers.SGD(0.1), lambda: tfk.optimizers.legacy.SGD(0.1)):
                model = mlp(tfk)
                model.compile(optimizer=hvd.DistributedOptimizer(make()), loss="mse")
                x, y = data(2 * MICRO, seed=50 + R)  # different data: the reduction is what equalizes
                model.fit(x, y, batch_size=MICRO, epochs=1, verbose=0)
                assert "LossScale" in type(model.optimizer).__name__, type(model.optimizer)
                assert int(model.optimizer.iterations) == 2
                assert_same_on_all_ranks(model.get_weights(), "mixed_float16")
            # Sum with lr / size takes Average's steps: the unscaled gradients that the loss-scale
            # optimizer passes to apply_gradients must not be reduced a second time (that would
            # multiply a Sum by the number of ranks).
            x, y = data(2 * MICRO, seed=60 + R)
            weights = {}
            for op, lr in ((hvd.Average, 0.1), (hvd.Sum, 0.1 / S)):
                model = mlp(tfk)
                model.compile(optimizer=hvd.DistributedOptimizer(tfk.optimizers.SGD(lr), op=op), loss="mse")
                model.fit(x, y, batch_size=MICRO, epochs=1, verbose=0, shuffle=False)
                weights[op] = model.get_weights()
            assert_weights_close(weights[hvd.Sum], weights[hvd.Average], rtol=2e-3, atol=2e-4,
                                 what="mixed_float16 Sum (lr / size) against Average")
        finally:
            tfk.mixed_precision.set_global_policy("float32")

    @case("jit_compile=True: the callbacks turn XLA off for the train step")
    def _():
        import warnings
        model = mlp(tfk)
        model.compile(optimizer=hvd.DistributedOptimizer(tfk.optimizers.SGD(0.1)), loss="mse", jit_compile=True)
        x, y = data(2 * MICRO, seed=40 + R)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            model.fit(x, y, batch_size=MICRO, epochs=1, verbose=0, callbacks=[cb.BroadcastGlobalVariablesCallback(0)])
        assert any("XLA" in str(w.message) for w in caught), [str(w.message) for w in caught]
        assert_same_on_all_ranks(model.get_weights(), "jit_compile fit")


def hvd_tf_optimizer_values(optimizer):
    variables = optimizer.variables
    return [v.numpy() for v in (variables() if callable(variables) else variables)]


# ---------------------------------------------------------------- variables, saving, elastic

def family_state(workdir):
    @case("broadcast_variables (both faces) gives the root's values")
    def _():
        model = mlp(tfk, seed=200 + R)
        hvd.broadcast_variables(model.variables, root_rank=0)
        assert_weights_close(model.get_weights(), mlp(tfk, seed=200).get_weights(), 0, 0, "broadcast_variables")
        v = tf.Variable([float(R)] * 3)
        hvd_tf.broadcast_variables([v], root_rank=S - 1)
        np.testing.assert_array_equal(v.numpy(), [float(S - 1)] * 3)

    for suffix, make in ((".h5", lambda: tfk.optimizers.legacy.Adam(0.01)),
                         (".keras", lambda: tfk.optimizers.Adam(0.01)),
                         ("", lambda: tfk.optimizers.RMSprop(0.01))):
        @case(f"load_model of a saved model{suffix or ' (SavedModel)'} trained with DistributedOptimizer")
        def _(suffix=suffix, make=make):
            path = os.path.join(workdir, "trained" + suffix if suffix else "trained_savedmodel")
            model = mlp(tfk)
            model.compile(optimizer=hvd.DistributedOptimizer(make()), loss="mse")
            x, y = data(2 * MICRO, seed=60 + R)
            model.fit(x, y, batch_size=MICRO, epochs=1, verbose=0)
            if R == 0:
                model.save(path)
            hvd.barrier()
            plain = tfk.models.load_model(path)  # plain tf_keras reads it: the plain optimizer class
            assert type(plain.optimizer) is type(make()), type(plain.optimizer)
            loaded = hvd.load_model(path)
            assert isinstance(loaded, tfk.Model)
            assert isinstance(loaded.optimizer, CollectivesOptimizer) and isinstance(loaded.optimizer, type(make()))
            assert_weights_close(loaded.get_weights(), model.get_weights(), 0, 0, "loaded weights")
            # The optimizer's state as plain tf_keras restores it (a SavedModel keeps none of a
            # new-style optimizer's, in tf_keras itself).
            iterations = int(plain.optimizer.iterations)
            assert int(loaded.optimizer.iterations) == iterations == (2 if suffix else 0), iterations
            x, y = data(2 * MICRO, seed=70 + R)
            loaded.fit(x, y, batch_size=MICRO, epochs=1, verbose=0)
            assert int(loaded.optimizer.iterations) == iterations + 2
            assert_same_on_all_ranks(loaded.get_weights(), "after load_model")

    @case("elastic KerasState: commit, restore and sync of a tf_keras model and optimizer")
    def _():
        # A wrapped legacy optimizer, and a plain new-style one (fit then trains locally).
        for make in (lambda: hvd.DistributedOptimizer(tfk.optimizers.legacy.Adam(0.01)),
                     lambda: tfk.optimizers.Adam(0.01)):
            model = mlp(tfk, seed=300 + R)
            model.compile(optimizer=make(), loss="mse")
            state = hvd.elastic.KerasState(model, batch=0, epoch=0)
            committed_optimizer = hvd_tf_optimizer_values(model.optimizer)
            assert committed_optimizer, "the state builds the optimizer's variables"
            state.sync()  # root's weights everywhere
            assert_same_on_all_ranks(model.get_weights(), "after sync")
            synced = model.get_weights()
            state.commit()
            x, y = data(2 * MICRO, seed=80 + R)
            model.fit(x, y, batch_size=MICRO, epochs=1, verbose=0)
            state.epoch = 5
            assert not np.allclose(model.get_weights()[0], synced[0])
            state.restore()
            assert_weights_close(model.get_weights(), synced, 0, 0, "restored weights")
            assert int(model.optimizer.iterations) == 0 and state.epoch == 0
            for v in hvd_tf_optimizer_values(model.optimizer):
                np.testing.assert_array_equal(v, np.zeros_like(v))


def family_example(workdir):
    @case("Horovod's tensorflow2_keras_mnist example, import line changed, synthetic data")
    def _():
        from keras2_horovod_example import train
        model, history = train(workdir)
        losses = history.history["loss"]
        assert losses[-1] < losses[0], losses
        assert_same_on_all_ranks(model.get_weights(), "example")
        assert_same_on_all_ranks([np.asarray(losses)], "averaged losses")
        if R == 0:
            assert os.path.exists(os.path.join(workdir, "checkpoint-2.h5"))


def main():
    global R, S, chk, tfk, WORKDIR
    mode, workdir = sys.argv[1], sys.argv[2]
    WORKDIR = workdir
    if mode == "env":
        assert os.environ.get("TF_USE_LEGACY_KERAS") == "1"
        tfk = tf.keras
    else:
        assert not os.environ.get("TF_USE_LEGACY_KERAS")
        import tf_keras
        tfk = tf_keras
    hvd.init()
    R, S = hvd.rank(), hvd.size()
    chk = Checker(R)
    if mode == "env":
        case("tf.keras is tf_keras")(lambda: None if tfk.Model.__module__.startswith("tf_keras") else 1 / 0)
        family_fit()
        family_callbacks()
        family_state(workdir)
        family_example(workdir)
    else:
        family_fit_light()
        family_callbacks(light=True)
        family_keras3_alongside()
    hvd.shutdown()
    chk.finish()


if __name__ == "__main__":
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    main()
