"""collectives.tensorflow / collectives.keras training on real ranks (run under mpirun).

Usage: tf_train_worker.py [--save PATH] FAMILY [FAMILY ...]

Families:
  tape       DistributedGradientTape: N ranks on 1/N of each batch reach the weights one
             process reaches on the whole batch (every rank computes that reference itself
             from the same seed), eagerly and in tf.function; groups, gradient_predivide_factor,
             op=Sum, fp16 compression, tf.IndexedSlices (allgathered, and sparse_as_dense);
             all gradients of a step travel in one hop.
  fit        model.fit with DistributedOptimizer against one process fitting the whole batch (with
             Keras 3's gradient_accumulation_steps for backward_passes_per_step > 1):
             SGD-momentum, Adam, backward_passes_per_step=2 (averaged and summed), fp16
             compression; a custom tf.function loop with optimizer.apply_gradients.
  callbacks  BroadcastGlobalVariablesCallback (differently initialized ranks end identical),
             MetricAverageCallback (logs hold the mean over ranks), learning-rate schedule and
             warmup, jit_compile=True (turned off by the callbacks, a clear error without
             them), mixed_float16 (LossScaleOptimizer outside the reduction).
  save       rank 0 saves a model trained with the wrapped optimizer to PATH (the test loads it
             in a process that never imports collectives); collectives.keras.load_model.
"""
import os
import sys

import keras
import numpy as np
import tensorflow as tf

import collectives.keras as hvd_keras
import collectives.tensorflow as hvd
from collectives.adapters.tensorflow import hops
from common import Checker
from keras_training import assert_same_on_all_ranks, assert_weights_close, data
from keras_training import mlp, rank_rows as my_rows

R = S = chk = None
MICRO = 4  # rows per rank per micro-batch


def case(label):
    def register(fn):
        chk.check(label, fn)
        return fn
    return register






def count_hops(fn):
    """Run fn and count the engine hops it traced or ran: "reduce_gradients" for a py_function
    hop of the gradient reducer, "engine op" for the engine's own TensorFlow op."""
    calls = []
    original = hops.run_hop
    import collectives.adapters.tensorflow.gradient_reducer as gr
    original_op = gr.engine_ops.reduce_gradients

    def counting(*args, **kwargs):
        calls.append(args[3])
        return original(*args, **kwargs)

    def counting_op(*args, **kwargs):
        calls.append("engine op")
        return original_op(*args, **kwargs)
    hops.run_hop = counting
    gr.run_hop = counting
    gr.engine_ops.reduce_gradients = counting_op
    try:
        fn()
    finally:
        hops.run_hop = original
        gr.run_hop = original
        gr.engine_ops.reduce_gradients = original_op
    return calls


# ---------------------------------------------------------------- tape

def tape_equivalence(steps=3, in_function=False, rtol=1e-5, atol=1e-6, scale=1.0, **kw):
    model, ref = mlp(keras), mlp(keras)
    opt, ref_opt = keras.optimizers.SGD(0.1), keras.optimizers.SGD(0.1)
    x, y = data(steps * S * MICRO, seed=1)

    def step(m, o, xb, yb, distributed):
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.square(m(xb) - yb))
        if distributed:
            tape = hvd.DistributedGradientTape(tape, **kw)
        grads = tape.gradient(loss, m.trainable_variables)
        if not distributed:
            grads = [g * scale for g in grads]
        o.apply_gradients(zip(grads, m.trainable_variables))

    dist_step = tf.function(lambda xb, yb: step(model, opt, xb, yb, True)) if in_function else \
        (lambda xb, yb: step(model, opt, xb, yb, True))
    mine_x, mine_y = my_rows(x, MICRO), my_rows(y, MICRO)
    for s in range(steps):
        step(ref, ref_opt, x[s * S * MICRO:(s + 1) * S * MICRO], y[s * S * MICRO:(s + 1) * S * MICRO], False)
        dist_step(mine_x[s * MICRO:(s + 1) * MICRO], mine_y[s * MICRO:(s + 1) * MICRO])
    assert_weights_close(model.get_weights(), ref.get_weights(), rtol, atol, "tape vs single process")
    assert_same_on_all_ranks(model.get_weights(), "tape")


def embedding_equivalence(sparse_as_dense, in_function):
    """An Embedding's gradient is a tf.IndexedSlices: allgathered, or reduced densely."""
    def make():
        keras.utils.set_random_seed(3)
        return keras.Sequential([keras.Input((3,), dtype="int32"), keras.layers.Embedding(20, 4),
                                 keras.layers.Flatten(), keras.layers.Dense(1)])
    model, ref = make(), make()
    opt, ref_opt = keras.optimizers.SGD(0.5), keras.optimizers.SGD(0.5)
    rng = np.random.default_rng(5)
    x = rng.integers(0, 20, size=(2 * S * MICRO, 3)).astype(np.int32)
    y = rng.normal(size=(2 * S * MICRO, 1)).astype(np.float32)
    kinds = []

    def step(m, o, xb, yb, distributed):
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.square(m(xb) - yb))
        if distributed:
            tape = hvd.DistributedGradientTape(tape, sparse_as_dense=sparse_as_dense)
        grads = tape.gradient(loss, m.trainable_variables)
        if distributed:
            kinds.append(type(grads[0]).__name__)
        o.apply_gradients(zip(grads, m.trainable_variables))

    dist = tf.function(lambda a, b: step(model, opt, a, b, True)) if in_function else \
        (lambda a, b: step(model, opt, a, b, True))
    mx, my = my_rows(x, MICRO), my_rows(y, MICRO)
    for s in range(2):
        step(ref, ref_opt, x[s * S * MICRO:(s + 1) * S * MICRO], y[s * S * MICRO:(s + 1) * S * MICRO], False)
        dist(mx[s * MICRO:(s + 1) * MICRO], my[s * MICRO:(s + 1) * MICRO])
    assert kinds[0] == ("EagerTensor" if sparse_as_dense else "IndexedSlices") or in_function, kinds
    assert_weights_close(model.get_weights(), ref.get_weights(), 1e-5, 1e-6, "embedding")


def family_tape():
    for in_function in (False, True):
        mode = "tf.function" if in_function else "eager"
        case(f"tape {mode}")(lambda: tape_equivalence(in_function=in_function))
        case(f"tape groups=2 {mode}")(lambda: tape_equivalence(in_function=in_function, groups=2))
        case(f"tape gradient_predivide_factor=2 {mode}")(
            lambda: tape_equivalence(in_function=in_function, gradient_predivide_factor=2.0))
        case(f"tape op=Sum {mode}")(lambda: tape_equivalence(in_function=in_function, op=hvd.Sum, scale=S))
        case(f"tape fp16 compression {mode}")(
            lambda: tape_equivalence(in_function=in_function, compression=hvd.Compression.fp16, rtol=1e-2,
                                     atol=1e-3))
        case(f"tape IndexedSlices allgathered {mode}")(lambda: embedding_equivalence(False, in_function))
        case(f"tape sparse_as_dense {mode}")(lambda: embedding_equivalence(True, in_function))

    @case("tape explicit variable groups")
    def _():
        model = mlp(keras)
        tape_equivalence(groups=[[v] for v in model.trainable_variables[:1]])

    @case("tape: one hop per gradient() call, nested sources keep their structure")
    def _():
        model = mlp(keras)
        x, y = data(MICRO, seed=R)
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.square(model(x) - y))
        tape = hvd.DistributedGradientTape(tape)
        assert isinstance(tape, tf.GradientTape)
        out = {}
        hops_made = count_hops(lambda: out.update(g=tape.gradient(loss, {"a": model.trainable_variables[:2],
                                                                         "b": model.trainable_variables[2]})))
        assert hops_made == ["reduce_gradients"], hops_made
        assert set(out["g"]) == {"a", "b"} and len(out["g"]["a"]) == 2
        assert_same_on_all_ranks(out["g"]["a"] + [out["g"]["b"]], "reduced gradients")

    @case("tape wrapped before recording; TF face's DistributedOptimizer signature")
    def _():
        model = mlp(keras)
        x, y = data(MICRO, seed=R)
        with hvd.DistributedGradientTape(tf.GradientTape(persistent=True)) as tape:
            loss = tf.reduce_mean(tf.square(model(x) - y))
        g1 = tape.gradient(loss, model.trainable_variables)
        g2 = tape.gradient(loss, model.trainable_variables)  # persistent: a second call works too
        for a, b in zip(g1, g2):
            np.testing.assert_array_equal(a.numpy(), b.numpy())
        assert_same_on_all_ranks(g1, "gradients of a tape wrapped before recording")
        opt = hvd.DistributedOptimizer(keras.optimizers.SGD(0.1), None, False, "", "", hvd.Compression.none, False, 2)
        assert opt._collectives_settings.backward_passes_per_step == 2

    @case("tape: a None gradient stays None")
    def _():
        model = mlp(keras)
        unused = tf.Variable(1.0)
        x, y = data(MICRO, seed=R)
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.square(model(x) - y))
        grads = hvd.DistributedGradientTape(tape).gradient(loss, model.trainable_variables + [unused])
        assert grads[-1] is None and all(g is not None for g in grads[:-1])


# ---------------------------------------------------------------- fit

def fit_equivalence(make_opt, passes=1, average=True, epochs=2, rtol=1e-5, atol=1e-6, ref_lr_scale=1.0, **kw):
    x, y = data(4 * passes * S * MICRO, seed=2)
    model, ref = mlp(keras), mlp(keras)
    model.compile(optimizer=hvd_keras.DistributedOptimizer(make_opt(1.0), backward_passes_per_step=passes,
                                                           average_aggregated_gradients=average, **kw), loss="mse")
    # The reference: one process on each micro-batch of all ranks, with Keras 3's own gradient
    # accumulation over `passes` of them (an update every `passes` calls, of their mean), whose
    # iterations count every call, as Horovod's and ours do (Adam's bias correction sees them).
    accumulation = {"gradient_accumulation_steps": passes} if passes > 1 else {}
    ref.compile(optimizer=make_opt(ref_lr_scale, **accumulation), loss="mse")
    ref.fit(x, y, batch_size=S * MICRO, epochs=epochs, shuffle=False, verbose=0)
    model.fit(my_rows(x, MICRO), my_rows(y, MICRO), batch_size=MICRO, epochs=epochs, shuffle=False, verbose=0)
    assert_weights_close(model.get_weights(), ref.get_weights(), rtol, atol, "fit vs single process")
    assert int(model.optimizer.iterations) == int(ref.optimizer.iterations), \
        (int(model.optimizer.iterations), int(ref.optimizer.iterations))
    assert_same_on_all_ranks(model.get_weights(), "fit")
    assert type(model.optimizer).__name__ == type(ref.optimizer).__name__


def family_fit():
    sgd = lambda k, **kw: keras.optimizers.SGD(0.05 * k, momentum=0.9, **kw)  # noqa: E731
    adam = lambda k, **kw: keras.optimizers.Adam(0.01 * k, **kw)  # noqa: E731
    case("fit SGD momentum")(lambda: fit_equivalence(sgd))
    case("fit Adam")(lambda: fit_equivalence(adam))
    case("fit Adam backward_passes_per_step=2 averaged")(lambda: fit_equivalence(adam, passes=2))
    # Summed micro-batch gradients: the reference takes twice the learning rate on their mean.
    case("fit SGD backward_passes_per_step=2 summed")(
        lambda: fit_equivalence(sgd, passes=2, average=False, ref_lr_scale=2.0))
    case("fit Adam fp16 compression")(
        lambda: fit_equivalence(adam, compression=hvd_keras.Compression.fp16, rtol=1e-2, atol=1e-3))

    @case("fit: the step's gradients cross to the engine in one hop")
    def _():
        model = mlp(keras)
        model.compile(optimizer=hvd_keras.DistributedOptimizer(keras.optimizers.SGD(0.1)), loss="mse")
        x, y = data(3 * MICRO, seed=R)
        traced = count_hops(lambda: model.fit(x, y, batch_size=MICRO, epochs=1, verbose=0))
        assert traced == ["engine op"], traced  # traced once: one engine op per step

    @case("custom tf.function loop with optimizer.apply_gradients")
    def _():
        x, y = data(3 * S * MICRO, seed=4)
        model, ref = mlp(keras), mlp(keras)
        opt = hvd_keras.DistributedOptimizer(keras.optimizers.Adam(0.01))
        ref_opt = keras.optimizers.Adam(0.01)

        def step(m, o, xb, yb):
            with tf.GradientTape() as tape:
                loss = tf.reduce_mean(tf.square(m(xb) - yb))
            o.apply_gradients(zip(tape.gradient(loss, m.trainable_variables), m.trainable_variables))
        dist = tf.function(lambda a, b: step(model, opt, a, b))
        mx, my = my_rows(x, MICRO), my_rows(y, MICRO)
        for s in range(3):
            step(ref, ref_opt, x[s * S * MICRO:(s + 1) * S * MICRO], y[s * S * MICRO:(s + 1) * S * MICRO])
            dist(mx[s * MICRO:(s + 1) * MICRO], my[s * MICRO:(s + 1) * MICRO])
        assert_weights_close(model.get_weights(), ref.get_weights(), 1e-5, 1e-6)

    @case("DistributedOptimizer keeps class, config and state")
    def _():
        base = keras.optimizers.Adam(0.003, beta_1=0.8)
        model = mlp(keras)
        base.build(model.trainable_variables)
        base.iterations.assign(7)
        wrapped = hvd_keras.DistributedOptimizer(base)
        assert isinstance(wrapped, keras.optimizers.Adam) and type(wrapped).__name__ == "Adam"
        assert type(wrapped).__module__ == keras.optimizers.Adam.__module__
        assert wrapped.get_config() == base.get_config()
        assert int(wrapped.iterations) == 7
        config = keras.saving.serialize_keras_object(wrapped)
        assert config == keras.saving.serialize_keras_object(base), config
        for bad in (lambda: hvd_keras.DistributedOptimizer(wrapped), lambda: hvd_keras.DistributedOptimizer(object()),
                    lambda: hvd_keras.DistributedOptimizer(keras.optimizers.SGD(), op=hvd.Sum,
                                                           gradient_predivide_factor=2.0)):
            try:
                bad()
            except ValueError:
                pass
            else:
                raise AssertionError("no ValueError")


# ---------------------------------------------------------------- callbacks

class RecordLogs(keras.callbacks.Callback):
    def __init__(self):
        super().__init__()
        self.epochs, self.lrs = [], []

    def on_epoch_end(self, epoch, logs=None):
        self.epochs.append(dict(logs))

    def on_train_batch_begin(self, batch, logs=None):
        self.lrs.append(float(keras.ops.convert_to_numpy(self.model.optimizer.learning_rate)))


def family_callbacks():
    cb = hvd_keras.callbacks

    @case("BroadcastGlobalVariablesCallback makes differently initialized ranks identical")
    def _():
        model = mlp(keras, seed=100 + R)
        # Learning rate 0: the weights after fit are the root's initial ones, on every rank.
        model.compile(optimizer=hvd_keras.DistributedOptimizer(keras.optimizers.SGD(0.0)), loss="mse")
        x, y = data(2 * MICRO, seed=10 + R)
        model.fit(x, y, batch_size=MICRO, epochs=1, verbose=0, callbacks=[cb.BroadcastGlobalVariablesCallback(0)])
        assert_weights_close(model.get_weights(), mlp(keras, seed=100).get_weights(), 0, 0, "root's initial weights")
        assert S == 1 or not np.allclose(mlp(keras, seed=101).get_weights()[0], mlp(keras, seed=100).get_weights()[0])

    @case("MetricAverageCallback logs the mean over ranks")
    def _():
        model = mlp(keras)
        model.compile(optimizer=hvd_keras.DistributedOptimizer(keras.optimizers.SGD(0.05)), loss="mse",
                      metrics=["mae"])
        x, y = data(2 * MICRO, seed=20 + R)  # different data: different local metrics
        before, after = RecordLogs(), RecordLogs()
        history = model.fit(x, y, batch_size=MICRO, epochs=2, verbose=0,
                            callbacks=[before, cb.MetricAverageCallback(), after])
        local = [e["loss"] for e in before.epochs]
        everyone = hvd.allgather_object(local)
        assert len({tuple(v) for v in everyone}) == S, "ranks should have different local losses"
        mean = np.mean(np.array(everyone), axis=0)
        np.testing.assert_allclose([e["loss"] for e in after.epochs], mean, rtol=1e-6)
        np.testing.assert_allclose(history.history["loss"], mean, rtol=1e-6)
        np.testing.assert_allclose(history.history["mae"],
                                   np.mean(hvd.allgather_object([e["mae"] for e in before.epochs]), axis=0),
                                   rtol=1e-6)

    @case("LearningRateWarmupCallback ramps from lr/size to lr")
    def _():
        model = mlp(keras)
        model.compile(optimizer=hvd_keras.DistributedOptimizer(keras.optimizers.SGD(0.4)), loss="mse")
        x, y = data(4 * MICRO, seed=30)
        rec = RecordLogs()
        model.fit(x, y, batch_size=MICRO, epochs=3, verbose=0,
                  callbacks=[cb.LearningRateWarmupCallback(initial_lr=0.4, warmup_epochs=2), rec])
        steps = 4
        expected = [0.4 / S * ((e + (b + 1) / steps) * (S - 1) / 2 + 1) for e in range(2) for b in range(steps)]
        np.testing.assert_allclose(rec.lrs[:8], expected, rtol=1e-6)
        np.testing.assert_allclose(rec.lrs[8:], [expected[-1]] * steps, rtol=1e-6)
        np.testing.assert_allclose(expected[-1], 0.4, rtol=1e-6)
        assert "lr" in rec.epochs[0]

    @case("LearningRateScheduleCallback staircase multiplier")
    def _():
        model = mlp(keras)
        model.compile(optimizer=hvd_keras.DistributedOptimizer(keras.optimizers.SGD(1.0)), loss="mse")
        x, y = data(2 * MICRO, seed=31)
        rec = RecordLogs()
        model.fit(x, y, batch_size=MICRO, epochs=3, verbose=0,
                  callbacks=[cb.LearningRateScheduleCallback(0.2, multiplier=0.5, start_epoch=1), rec])
        np.testing.assert_allclose([e["lr"] for e in rec.epochs], [1.0, 0.1, 0.05], rtol=1e-6)

    @case("jit_compile=True: the callbacks turn XLA off for the train step")
    def _():
        model = mlp(keras)
        model.compile(optimizer=hvd_keras.DistributedOptimizer(keras.optimizers.SGD(0.1)), loss="mse",
                      jit_compile=True)
        x, y = data(2 * MICRO, seed=40 + R)
        import warnings
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            model.fit(x, y, batch_size=MICRO, epochs=1, verbose=0,
                      callbacks=[cb.BroadcastGlobalVariablesCallback(0)])
        assert any("XLA" in str(w.message) for w in caught), [str(w.message) for w in caught]
        assert model.jit_compile is False
        assert_same_on_all_ranks(model.get_weights(), "jit_compile fit")

    @case("jit_compile=True without the callbacks: a clear error")
    def _():
        model = mlp(keras)
        model.compile(optimizer=hvd_keras.DistributedOptimizer(keras.optimizers.SGD(0.1)), loss="mse",
                      jit_compile=True)
        x, y = data(MICRO, seed=41)
        try:
            model.fit(x, y, batch_size=MICRO, epochs=1, verbose=0)
        except Exception as e:  # noqa: BLE001 - Keras may re-wrap it; the message must say what to do
            assert "jit_compile" in str(e) and "XLA" in str(e), f"{type(e).__name__}: {e}"
        else:
            raise AssertionError("fit under XLA did not raise")

    @case("mixed_float16: LossScaleOptimizer outside the reduction")
    def _():
        keras.config.set_dtype_policy("mixed_float16")
        try:
            model = mlp(keras)
            opt = hvd_keras.DistributedOptimizer(keras.optimizers.SGD(0.1))
            assert isinstance(opt, keras.optimizers.LossScaleOptimizer)
            model.compile(optimizer=opt, loss="mse")
            assert model.optimizer is opt
            x, y = data(2 * MICRO, seed=50 + R)
            model.fit(x, y, batch_size=MICRO, epochs=1, verbose=0)
            assert_same_on_all_ranks(model.get_weights(), "mixed_float16")
        finally:
            keras.config.set_dtype_policy("float32")


# ---------------------------------------------------------------- save

def family_save(path):
    @case("save a model trained with DistributedOptimizer")
    def _():
        model = mlp(keras)
        model.compile(optimizer=hvd_keras.DistributedOptimizer(keras.optimizers.Adam(0.01)), loss="mse")
        x, y = data(2 * MICRO, seed=60 + R)
        model.fit(x, y, batch_size=MICRO, epochs=1, verbose=0)
        if R == 0:
            model.save(path)
            np.savez(path + ".npz", *model.get_weights())
        hvd.barrier()

    @case("collectives.keras.load_model wraps the optimizer and training continues")
    def _():
        model = hvd_keras.load_model(path)
        from collectives.adapters.tensorflow.keras_optimizer import _DistributedOptimizer
        assert isinstance(model.optimizer, _DistributedOptimizer)
        assert int(model.optimizer.iterations) == 2
        x, y = data(2 * MICRO, seed=70 + R)
        model.fit(x, y, batch_size=MICRO, epochs=1, verbose=0)
        assert_same_on_all_ranks(model.get_weights(), "after load_model")


def main():
    global R, S, chk
    args = sys.argv[1:]
    save_path = None
    if args and args[0] == "--save":
        save_path, args = args[1], args[2:]
    hvd.init()
    R, S = hvd.rank(), hvd.size()
    chk = Checker(R)
    for fam in args:
        if fam == "save":
            family_save(save_path)
        else:
            {"tape": family_tape, "fit": family_fit, "callbacks": family_callbacks}[fam]()
    hvd.shutdown()
    chk.finish()


if __name__ == "__main__":
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    main()
