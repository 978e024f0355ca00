"""collectives.keras DistributedOptimizer(zero_stage=1/2) on real ranks (run under mpirun).

Usage: keras_zero_worker.py FAMILY [FAMILY ...]

Every comparison trains the same model from the same seed on the same rows of each rank twice:
with the unsharded DistributedOptimizer (zero_stage=0, the reference) and with the sharded one,
and compares the weights after K steps (fp32 weights to rtol 1e-5: the reducescatter and the
allreduce may add in different orders; bf16 weights to 2e-2) and checks that every rank holds
the same weights. The model has a frozen layer, a variable that never gets a gradient, and a
bfloat16 layer beside float32 ones (one bucket per dtype).

Families:
  equiv    SGD-momentum, Adam, AdamW x stage 1, 2 x model.fit (a tf.function) and an eager custom
           loop (GradientTape, apply_gradients); equiv-fit: model.fit only.
  options  op=Sum, fp16 compression, gradient_predivide_factor, backward_passes_per_step=2
           (stage 1 and 2), global_clipnorm (over every shard), the tensorflow face's wrapper.
  state    consolidate(to=0) equals the reference optimizer's state (and a model saved with it
           loads it in plain Keras); BroadcastGlobalVariablesCallback on resuming leaves each rank's
           shard state; wrapping a stepped optimizer keeps its state; load_full of a plain
           optimizer's state then one step equals the reference's next step; each rank's slots
           count about 1/N of the unsharded optimizer's.
  mixed    mixed_float16 (LossScaleOptimizer) with fit, also with global_clipnorm; one rank's
           infinite gradient makes every rank skip the step and halve the loss scale.
  sets     (np 3) a process set of ranks 0 and 1; rank 2 steps alone.
  sharded  (np 3) save_sharded_state_dict by a process set of ranks 0 and 1, loaded at 3 ranks and
           at 1 (rank 2 alone): the consolidated state equals the one saved, bitwise; another
           model's checkpoint and an incomplete set raise InvalidArgumentError; an elastic commit
           of a sharded optimizer restored into an unsharded one (and the reverse): ValueError.
  errors   refused on every rank: Lamb/Adafactor, Lamb on one rank only, clipnorm, zero_stage=3,
           Adasum, a tf.IndexedSlices gradient without sparse_as_dense (with it: the dense step);
           models that differ between ranks -> TensorMismatchError on every rank.
"""
import os
import shutil
import sys
import tempfile
import warnings

import keras
import numpy as np
import tensorflow as tf

import collectives.keras as hvd
import collectives.tensorflow as hvd_tf
from collectives.errors import InvalidArgumentError, NotSupportedError, TensorMismatchError
from common import Checker, raises
from keras_training import assert_same_on_all_ranks, data, rank_rows

R = S = chk = None
MICRO = 4   # rows per rank per step
STEPS = 3


class Net(keras.Model):
    """Dense -> frozen Dense -> bfloat16 Dense -> Dense, and a weight never used (no gradient)."""

    def __init__(self, hidden=8, half="bfloat16", **kw):
        super().__init__(**kw)
        self.a = keras.layers.Dense(hidden, activation="tanh")
        self.frozen = keras.layers.Dense(hidden, activation="tanh", trainable=False)
        self.half = keras.layers.Dense(5, activation="tanh", dtype=half)
        self.out = keras.layers.Dense(2)
        self.spare = self.add_weight(shape=(5,), initializer="ones", name="spare")

    def call(self, x):
        return self.out(tf.cast(self.half(self.frozen(self.a(x))), tf.float32))


def make_model(seed=0, hidden=8, half="bfloat16"):
    keras.utils.set_random_seed(seed)
    model = Net(hidden, half)
    model(np.zeros((1, 6), np.float32))
    return model


OPTIMIZERS = {
    "sgd": lambda **kw: keras.optimizers.SGD(0.1, momentum=0.9, **kw),
    "adam": lambda **kw: keras.optimizers.Adam(0.01, **kw),
    "adamw": lambda **kw: keras.optimizers.AdamW(0.01, weight_decay=0.05, **kw),
}


def my_data(steps=STEPS, seed=1):
    x, y = data(steps * S * MICRO, seed=seed)
    return rank_rows(x, MICRO), rank_rows(y, MICRO)


def train(model, opt, mode, x, y):
    if mode == "fit":
        model.compile(optimizer=opt, loss="mse")
        model.fit(x, y, batch_size=MICRO, epochs=1, shuffle=False, verbose=0)
        return
    loss_fn = keras.losses.MeanSquaredError()

    def step(xb, yb):  # eager (model.fit runs its steps in a tf.function): no tracing per case
        with tf.GradientTape() as tape:
            loss = loss_fn(yb, model(xb))
        grads = tape.gradient(loss, model.trainable_variables)
        opt.apply_gradients(zip(grads, model.trainable_variables))

    for i in range(0, len(x), MICRO):
        step(x[i:i + MICRO], y[i:i + MICRO])


def run(opt_name, mode, stage, opt_kw=None, wrap=hvd.DistributedOptimizer, steps=STEPS, half="bfloat16", **kw):
    model = make_model(half=half)
    opt = wrap(OPTIMIZERS[opt_name](**(opt_kw or {})), zero_stage=stage, **kw)
    x, y = my_data(steps)
    train(model, opt, mode, x, y)
    return model, opt


def assert_weights_match(model, reference, what, same_on_all_ranks=True):
    for v, r in zip(model.weights, reference.weights):
        a, b = np.asarray(v.value, np.float32), np.asarray(r.value, np.float32)
        tol = 2e-2 if v.dtype == "bfloat16" else 1e-5
        np.testing.assert_allclose(a, b, rtol=tol, atol=tol, err_msg=f"{what}: {v.path}")
    if same_on_all_ranks:
        assert_same_on_all_ranks([np.asarray(v.value, np.float32) for v in model.weights], what)


def trainable_changed(model, what):
    """The run did something: the first layer moved, the frozen layer and the spare weight did not."""
    fresh = make_model()
    assert not np.allclose(np.asarray(model.a.kernel.value), np.asarray(fresh.a.kernel.value)), what
    np.testing.assert_array_equal(np.asarray(model.frozen.kernel.value), np.asarray(fresh.frozen.kernel.value))
    np.testing.assert_array_equal(np.asarray(model.spare.value), np.asarray(fresh.spare.value))


# ---------------------------------------------------------------- families

def family_equiv(modes=("fit", "loop")):
    for opt_name in OPTIMIZERS:
        for mode in modes:
            reference, _ = run(opt_name, mode, 0)
            for stage in (1, 2):
                label = f"equiv {opt_name} {mode} stage {stage}"

                def check(opt_name=opt_name, mode=mode, stage=stage, label=label):
                    model, _ = run(opt_name, mode, stage)
                    assert_weights_match(model, reference, label)
                    trainable_changed(model, label)
                chk.check(label, check)


def family_options():
    cases = [
        # (label, optimizer, DistributedOptimizer's and the model's arguments, the optimizer's, stages)
        ("op=Sum", "sgd", {"op": hvd.Sum}, {}, (2,)),
        ("fp16 compression, gradient_predivide_factor=2", "adam",
         {"compression": hvd.Compression.fp16, "gradient_predivide_factor": 2.0}, {}, (1,)),
        # float32 only: stage 2 adds reduced bfloat16 shards where the reference reduces bfloat16 sums
        # (different roundings, which the later steps carry into every weight).
        ("backward_passes_per_step=2 averaged", "adam", {"backward_passes_per_step": 2, "half": "float32",
                                                         "average_aggregated_gradients": True}, {}, (1, 2)),
        ("backward_passes_per_step=2 summed", "sgd", {"backward_passes_per_step": 2, "half": "float32"}, {}, (2,)),
        # Keras' own clip_by_global_norm (the unsharded reference) cannot mix bfloat16 and float32.
        ("global_clipnorm", "adam", {"half": "float32"}, {"global_clipnorm": 0.05}, (2,)),
    ]
    for label, opt_name, kw, opt_kw, stages in cases:
        references = []
        chk.check(f"options {label} reference", lambda: references.append(run(opt_name, "fit", 0, opt_kw, steps=4,
                                                                               **kw)[0]))
        for stage in stages:
            def check(label=f"options {label} stage {stage}", opt_name=opt_name, stage=stage, kw=kw, opt_kw=opt_kw):
                model, _ = run(opt_name, "fit", stage, opt_kw, steps=4, **kw)
                assert_weights_match(model, references[0], label)
            chk.check(f"options {label} stage {stage}", check)

    def tf_face():
        reference, _ = run("adam", "loop", 0, wrap=hvd_tf.DistributedOptimizer)
        model, _ = run("adam", "loop", 2, wrap=hvd_tf.DistributedOptimizer)
        assert_weights_match(model, reference, "collectives.tensorflow.DistributedOptimizer")
    chk.check("collectives.tensorflow.DistributedOptimizer(zero_stage=2)", tf_face)


def slot_numel(opt, model):
    shapes = {tuple(v.shape) for v in model.trainable_variables}
    return sum(int(np.prod(v.shape)) for v in opt.variables if tuple(v.shape) in shapes and len(v.shape))


def family_state():
    reference, ref_opt = run("adam", "fit", 0)
    model, opt = run("adam", "fit", 2)

    def consolidated():
        plain = opt.consolidate(to=0)
        if R != 0:
            assert plain is None
            return
        assert type(plain) is keras.optimizers.Adam, type(plain)
        assert len(plain.variables) == len(ref_opt.variables), (len(plain.variables), len(ref_opt.variables))
        for mine, theirs in zip(plain.variables, ref_opt.variables):
            assert mine.shape == theirs.shape, (mine.path, theirs.path)
            tol = 2e-2 if mine.dtype == "bfloat16" else 1e-5
            np.testing.assert_allclose(np.asarray(mine.value, np.float32), np.asarray(theirs.value, np.float32),
                                       rtol=tol, atol=1e-7, err_msg=mine.path)
        assert int(plain.iterations) == STEPS
        # model.save with the plain optimizer in place: plain Keras loads the whole state.
        path = os.path.join(os.environ.get("TMPDIR", "/tmp"), f"keras_zero_{os.getpid()}.keras")
        model.optimizer = plain
        try:
            model.save(path)
        finally:
            model.optimizer = opt
        try:
            loaded = keras.models.load_model(path, custom_objects={"Net": Net})
        finally:
            os.remove(path)
        assert type(loaded.optimizer) is keras.optimizers.Adam, type(loaded.optimizer)
        for mine, theirs in zip(loaded.optimizer.variables, plain.variables):
            np.testing.assert_array_equal(np.asarray(mine.value), np.asarray(theirs.value), err_msg=mine.path)
    chk.check("state consolidate(to=0) is the plain Adam's state; model.save with it loads in plain Keras",
              consolidated)

    def broadcast_callback():
        # Resuming fit with BroadcastGlobalVariablesCallback: the model's variables and the
        # replicated optimizer variables come from rank 0; each rank keeps its own shard's slots.
        x, y = my_data(1, seed=7)
        for m in (reference, model):
            m.fit(x, y, batch_size=MICRO, epochs=1, shuffle=False, verbose=0,
                  callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0)])
        assert_weights_match(model, reference, "after BroadcastGlobalVariablesCallback")
    chk.check("state BroadcastGlobalVariablesCallback leaves each rank's shard state", broadcast_callback)

    def loaded():
        # A fresh sharded optimizer takes the reference's state; one more step on each side agrees.
        x, y = my_data(1, seed=5)
        fresh = make_model()
        fresh.set_weights(reference.get_weights())
        sharded = hvd.DistributedOptimizer(keras.optimizers.Adam(0.01), zero_stage=1)
        sharded.build(fresh.trainable_variables)
        sharded.load_full(ref_opt)
        assert int(sharded.iterations) == int(ref_opt.iterations) > 0
        train(fresh, sharded, "loop", x, y)
        train(reference, ref_opt, "loop", x, y)
        assert_weights_match(fresh, reference, "loaded state")
    chk.check("state load_full(plain Adam) then a step", loaded)

    def memory():
        model = make_model(hidden=64)
        plain = keras.optimizers.Adam(0.01)
        plain.build(model.trainable_variables)
        unsharded = slot_numel(plain, model)
        opt = hvd.DistributedOptimizer(keras.optimizers.Adam(0.01), zero_stage=1)
        opt.build(model.trainable_variables)
        mine = opt.shard_state_numel()
        padding = 2 * (16 + 32)  # two slots; a float32 and a bfloat16 bucket, each padded by < 64 bytes per rank
        assert unsharded / S <= mine <= unsharded / S + padding, (mine, unsharded, S)
        total = sum(hvd.allgather_object(mine))
        assert unsharded <= total <= unsharded + S * padding, (total, unsharded)
    chk.check("state shard_state_numel about 1/N of the unsharded slots", memory)

    def carried():
        # Wrapping an optimizer that has stepped keeps its state (the same on every rank here).
        model = make_model()
        plain = keras.optimizers.Adam(0.01)
        plain.apply([tf.ones(v.shape, v.dtype) for v in model.trainable_variables], model.trainable_variables)
        sharded = hvd.DistributedOptimizer(plain, zero_stage=2)
        back = sharded.consolidate(to=0)
        if R == 0:
            for mine, theirs in zip(back.variables, plain.variables):
                np.testing.assert_array_equal(np.asarray(mine.value), np.asarray(theirs.value), err_msg=mine.path)
    chk.check("state wrapping a stepped optimizer carries its state", carried)


def family_mixed():
    keras.mixed_precision.set_global_policy("mixed_float16")
    try:
        reference, _ = run("sgd", "fit", 0)
        for stage in (1, 2):
            def check(stage=stage):
                model, opt = run("sgd", "fit", stage)
                assert isinstance(opt, keras.optimizers.LossScaleOptimizer), type(opt)
                assert_weights_match(model, reference, f"mixed_float16 stage {stage}")
            chk.check(f"mixed_float16 fit stage {stage}", check)

        def clipped():  # global_clipnorm on the LossScaleOptimizer's inner optimizer, over every shard
            clip = {"global_clipnorm": 0.05}
            reference, _ = run("adam", "fit", 0, clip, half="float32")
            model, _ = run("adam", "fit", 2, clip, half="float32")
            assert_weights_match(model, reference, "mixed_float16 global_clipnorm")
        chk.check("mixed_float16 global_clipnorm stage 2", clipped)

        def one_rank_infinite():
            model = make_model()
            opt = hvd.DistributedOptimizer(keras.optimizers.SGD(0.1), zero_stage=2)
            before = [np.asarray(v.value, np.float32) for v in model.trainable_variables]
            grads = [tf.ones(v.shape, v.dtype) for v in model.trainable_variables]
            if R == S - 1:  # one element of one gradient, owned by one rank's shard only
                g = grads[0].numpy().reshape(-1)
                g[0] = np.inf
                grads[0] = tf.constant(g.reshape(grads[0].shape))
            opt.apply(grads, model.trainable_variables)
            for a, v in zip(before, model.trainable_variables):
                np.testing.assert_array_equal(a, np.asarray(v.value, np.float32), err_msg=v.path)
            assert float(opt.dynamic_scale) == 2.0 ** 14, float(opt.dynamic_scale)
            opt.apply([tf.ones(v.shape, v.dtype) * 1000 for v in model.trainable_variables], model.trainable_variables)
            after = [np.asarray(v.value, np.float32) for v in model.trainable_variables]
            assert all(not np.array_equal(a, b) for a, b in zip(before, after)), "a finite step changed nothing"
        chk.check("mixed_float16 one rank's inf gradient: every rank skips", one_rank_infinite)
    finally:
        keras.mixed_precision.set_global_policy("float32")


def family_sets():
    """np 3: ranks 0 and 1 shard over a process set; rank 2, outside it, steps alone (as unsharded)."""
    ps = hvd.add_process_set([0, 1])
    try:
        references = []
        chk.check("sets reference", lambda: references.append(run("adam", "fit", 0, process_set=ps)[0]))

        def sharded():
            model, opt = run("adam", "fit", 2, process_set=ps)
            assert_weights_match(model, references[0], "process set", same_on_all_ranks=False)
            mine = np.asarray(model.a.kernel.value)
            gathered = hvd.allgather_object(mine)
            np.testing.assert_array_equal(gathered[0], gathered[1])
            assert not np.array_equal(gathered[0], gathered[2]), "rank 2 is outside the set: its own steps"
        chk.check("sets zero_stage=2 over ranks 0 and 1, rank 2 alone", sharded)
    finally:
        hvd.remove_process_set(ps)


def family_sharded():
    """np 3: saved sharded by ranks 0 and 1 (a process set), loaded at 3 ranks and at 1 (rank 2 alone)."""
    assert S == 3, "family sharded runs at np 3"
    directory = hvd.broadcast_object(tempfile.mkdtemp(prefix="keras_zero_sharded_") if R == 0 else None)
    pair, alone = hvd.add_process_set([0, 1]), hvd.add_process_set([2])
    try:
        saved = []

        def save():
            if R < 2:
                model, opt = run("adam", "fit", 2, process_set=pair)
                path = opt.save_sharded_state_dict(directory)
                assert os.path.basename(path) == f"zero-shard-0000{R}-of-00002.npz", path
                plain = opt.consolidate(to=0)
                weights = model.get_weights()
            whole = hvd.broadcast_object(([np.asarray(v.value) for v in plain.variables], weights) if R == 0
                                         else None)
            saved.append(whole)
        chk.check("sharded save_sharded_state_dict at 2 ranks (a process set)", save)

        def loaded(opt, what):
            model = make_model()
            model.set_weights(saved[0][1])
            opt.build(model.trainable_variables)
            opt.load_sharded_state_dict(directory)
            plain = opt.consolidate(to=0)
            if plain is not None:
                assert len(plain.variables) == len(saved[0][0])
                for mine, theirs in zip(plain.variables, saved[0][0]):
                    np.testing.assert_array_equal(np.asarray(mine.value), theirs, err_msg=f"{what}: {mine.path}")
            return model, opt
        chk.check("sharded loaded at 3 ranks: consolidated equals the state saved at 2", lambda: loaded(
            hvd.DistributedOptimizer(keras.optimizers.Adam(0.01), zero_stage=1), "at 3"))

        def at_one():
            if R == 2:
                loaded(hvd.DistributedOptimizer(keras.optimizers.Adam(0.01), zero_stage=2, process_set=alone), "at 1")
        chk.check("sharded loaded at 1 rank: its state equals the state saved at 2", at_one)

        def refused():
            other = make_model(hidden=9)
            opt = hvd.DistributedOptimizer(keras.optimizers.Adam(0.01), zero_stage=1)
            opt.build(other.trainable_variables)
            raises(InvalidArgumentError, lambda: opt.load_sharded_state_dict(directory), "variables differ")
            hvd.broadcast_object(None)  # every rank read the files before one is removed
            if R == 0:
                os.remove(os.path.join(directory, "zero-shard-00001-of-00002.npz"))
            hvd.broadcast_object(None)
            raises(InvalidArgumentError, lambda: opt.load_sharded_state_dict(directory), "expected the shards")
        chk.check("sharded another model's checkpoint, an incomplete set -> InvalidArgumentError", refused)

        def mixed_commits():
            # An elastic commit of a sharded optimizer restored into an unsharded one, and the reverse.
            sharded = hvd.DistributedOptimizer(keras.optimizers.Adam(0.01), zero_stage=1)
            state = hvd.elastic.KerasState(make_model(), sharded)
            plain = hvd.elastic.KerasState(make_model(), hvd.DistributedOptimizer(keras.optimizers.Adam(0.01)))
            commit = state._persistent_state()
            assert len(commit["optimizer"]["zero_shards"]) == S
            raises(ValueError, lambda: plain._load_persistent_state(commit), "has a sharded optimizer's state")
            raises(ValueError, lambda: state._load_persistent_state(plain._persistent_state()),
                   "has an unsharded optimizer's state")
        chk.check("sharded elastic commits of a sharded optimizer and an unsharded one do not mix", mixed_commits)
    finally:
        hvd.broadcast_object(None)
        if R == 0:
            shutil.rmtree(directory, ignore_errors=True)
        hvd.remove_process_set(alone)
        hvd.remove_process_set(pair)


def family_errors():
    def refused(make, error, text, stage=2):
        raises(error, lambda: hvd.DistributedOptimizer(make(), zero_stage=stage), text)

    chk.check("errors Lamb refused", lambda: refused(lambda: keras.optimizers.Lamb(0.01), NotSupportedError,
                                                     "Lamb cannot step on a shard"))
    chk.check("errors Adafactor refused", lambda: refused(lambda: keras.optimizers.Adafactor(0.01),
                                                          NotSupportedError, "Adafactor cannot step on a shard"))
    chk.check("errors Lamb on one rank refused on every rank", lambda: refused(
        lambda: keras.optimizers.Lamb(0.01) if R == S - 1 else keras.optimizers.Adam(0.01), NotSupportedError,
        "Lamb cannot step on a shard"))
    chk.check("errors clipnorm refused", lambda: refused(lambda: keras.optimizers.Adam(0.01, clipnorm=1.0),
                                                         NotSupportedError, "clipnorm"))
    chk.check("errors zero_stage=3", lambda: refused(lambda: keras.optimizers.Adam(0.01), InvalidArgumentError,
                                                     "zero_stage must be 0", stage=3))
    chk.check("errors Adasum", lambda: raises(NotSupportedError, lambda: hvd.DistributedOptimizer(
        keras.optimizers.Adam(0.01), zero_stage=1, op=hvd.Adasum), "Adasum"))

    def sparse():
        keras.utils.set_random_seed(0)
        embedding = keras.layers.Embedding(10, 4)
        embedding.build((None,))

        def grads():
            with tf.GradientTape() as tape:
                loss = tf.reduce_sum(embedding(tf.constant([R % 10, 3])))
            return tape.gradient(loss, embedding.trainable_variables)
        assert isinstance(grads()[0], tf.IndexedSlices)
        opt = hvd.DistributedOptimizer(keras.optimizers.SGD(0.5), zero_stage=2)
        raises(NotSupportedError, lambda: opt.apply(grads(), embedding.trainable_variables), "sparse_as_dense=True")
        before = np.asarray(embedding.embeddings.value)
        opt = hvd.DistributedOptimizer(keras.optimizers.SGD(0.5), zero_stage=2, sparse_as_dense=True)
        opt.apply(grads(), embedding.trainable_variables)
        expected = before.copy()
        for r in range(S):  # each rank's rows r % 10 and 3 got a gradient of ones, averaged over the ranks
            expected[[r % 10, 3]] -= 0.5 / S
        np.testing.assert_allclose(np.asarray(embedding.embeddings.value), expected, rtol=1e-6)
    chk.check("errors sparse gradient without sparse_as_dense; with it, dense", sparse)

    def models_differ():
        model = make_model(hidden=9 if R == S - 1 else 8)
        opt = hvd.DistributedOptimizer(keras.optimizers.Adam(0.01), zero_stage=1)
        raises(TensorMismatchError, lambda: opt.build(model.trainable_variables), "different parameters")
    chk.check("errors models that differ -> TensorMismatchError on every rank", models_differ)


def main():
    global R, S, chk
    hvd.init()
    R, S = hvd.rank(), hvd.size()
    chk = Checker(R)
    families = {"equiv": family_equiv, "equiv-fit": lambda: family_equiv(("fit",)), "options": family_options,
                "state": family_state, "mixed": family_mixed, "sets": family_sets,
                "sharded": family_sharded, "errors": family_errors}
    for fam in sys.argv[1:]:
        families[fam]()
    hvd.shutdown()
    chk.finish()


if __name__ == "__main__":
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    warnings.filterwarnings("ignore", message="Gradients do not exist")  # the spare weight's, on purpose
    tf.get_logger().setLevel("ERROR")  # retracing notes: every case traces its own functions
    main()
