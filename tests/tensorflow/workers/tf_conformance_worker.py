"""Horovod behaviours of collectives.tensorflow / collectives.keras that Horovod scripts rely on
(run under mpirun, one process per rank).

Usage: tf_conformance_worker.py FAMILY [FAMILY ...]

Families:
  names      ccl_built/ddl_built, _executing_eagerly, process_set_included_op, broadcast_object_fn,
             broadcast_global_variables (RuntimeError when eager), load_model(legacy_opts=...).
  rsgrad     reducescatter / grouped_reducescatter gradients: Horovod's convention.
  uint16     allgather, grouped_allgather, broadcast, alltoall of uint16 tensors (values above
             32767 included), eagerly and in tf.function.
  slices     tf.IndexedSlices: Average over integer values is the true quotient; pre/postscale
             factors raise NotImplementedError.
  errors     the TensorFlow exception types of Horovod's ops (FailedPrecondition for a mismatch,
             InvalidArgument for a bad root or bad splits), still collectives errors, on every rank.
  iterations Keras DistributedOptimizer(backward_passes_per_step=2): iterations counts updates and
             Adam's steps match one process with Keras 3's own gradient_accumulation_steps.
  local      PartialDistributedGradientTape / register_local_source, keras PartialDistributedOptimizer /
             register_local_var, BroadcastGlobalVariablesCallback(local_variables=...),
             callbacks.BestModelCheckpoint.
  dropin     issue 35: size_op of a process set, horovod.common.util's names, DistributedGradientTape
             and Keras DistributedOptimizer with a set this rank is not in, float alltoall splits.
"""
import os
import pickle
import sys
import tempfile

import numpy as np

import collectives
import collectives.tensorflow as hvd

hvd.init()

import keras  # noqa: E402
import tensorflow as tf  # noqa: E402

import collectives.keras as hvd_keras  # noqa: E402
from common import Checker, raises, rank_input  # noqa: E402

R, S = hvd.rank(), hvd.size()
chk = Checker(R)
MODES = ("eager", "function")


def run(mode, fn, *args):
    return fn(*args) if mode == "eager" else tf.function(fn)(*args)



# ---------------------------------------------------------------- names

def family_names():
    def builds():
        for face in (collectives, hvd, hvd_keras):
            assert face.ccl_built() is False and face.ddl_built() is False, face.__name__
        assert hvd._executing_eagerly() is True
        assert tf.function(lambda: tf.constant(hvd._executing_eagerly()))().numpy() == False  # noqa: E712
    chk.check("ccl_built/ddl_built False, _executing_eagerly", builds)

    def included_op():
        odd = hvd.add_process_set([r for r in range(S) if r % 2 == 1])
        assert int(hvd.process_set_included_op(0)) == 1
        assert int(hvd.process_set_included_op(odd.process_set_id)) == R % 2
        assert int(hvd.process_set_included_op(99)) == -3
        hvd.remove_process_set(odd)
    chk.check("process_set_included_op", included_op)

    def object_fn():
        bcast = hvd.broadcast_object_fn(root_rank=S - 1, name="objfn")
        assert bcast({"rank": R}) == {"rank": S - 1}
    chk.check("broadcast_object_fn", object_fn)

    def global_variables():
        for face in (hvd, hvd_keras):
            raises(RuntimeError, lambda: face.broadcast_global_variables(0), "eager")
    chk.check("broadcast_global_variables raises RuntimeError when executing eagerly", global_variables)

    def load_model_legacy_opts():
        model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
        model.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse")
        path = os.path.join(tempfile.mkdtemp(), "m.keras")
        model.save(path)
        loaded = hvd_keras.load_model(path, legacy_opts=True)
        assert isinstance(loaded.optimizer, keras.optimizers.SGD)
        assert "_DistributedOptimizer" in [c.__name__ for c in type(loaded.optimizer).__mro__]
    chk.check("keras load_model(legacy_opts=True)", load_model_legacy_opts)


# ---------------------------------------------------------------- reducescatter gradients

def _rows(dim0, rank):
    sizes = [dim0 // S + (1 if r < dim0 % S else 0) for r in range(S)]
    return sizes[rank]


def family_rsgrad():
    dim0 = 2 * S + 1
    for mode in MODES:
        for label, op, pre, post in (("Sum", hvd.Sum, 1.0, 1.0), ("Average", hvd.Average, 1.0, 1.0),
                                     ("Sum scaled", hvd.Sum, 0.5, 3.0)):
            def case(mode=mode, label=label, op=op, pre=pre, post=post):
                x = tf.constant(rank_input(1, R, (dim0, 2), np.float64))
                weights = [rank_input(2, r, (_rows(dim0, r), 2), np.float64) for r in range(S)]

                def grad(x):
                    with tf.GradientTape() as tape:
                        tape.watch(x)
                        y = hvd.reducescatter(x, op=op, prescale_factor=pre, postscale_factor=post,
                                              name=f"tfrs.{mode}.{label}")
                        loss = tf.reduce_sum(y * weights[R])
                    return tape.gradient(loss, x)
                expected = np.concatenate(weights) * (S if op == hvd.Sum else 1) * pre * post
                np.testing.assert_allclose(np.asarray(run(mode, grad, x)), expected, rtol=1e-12)
            chk.check(f"reducescatter gradient {label} ({mode})", case)


# ---------------------------------------------------------------- uint16

def family_uint16():
    def values(seed, rank, shape):
        return np.random.default_rng([seed, rank]).integers(0, 65536, size=shape).astype(np.uint16)

    for mode in MODES:
        def allgathers(mode=mode):
            mine = tf.constant(values(1, R, (R + 1, 2)))
            got = run(mode, lambda t: hvd.allgather(t, name=f"u16.ag.{mode}"), mine)
            assert got.dtype == tf.uint16
            np.testing.assert_array_equal(got.numpy(), np.concatenate([values(1, r, (r + 1, 2)) for r in range(S)]))
            pair = [tf.constant(values(2, R, (2,))), tf.constant(values(3, R, (1, 3)))]
            got = run(mode, lambda a, b: hvd.grouped_allgather([a, b], name=f"u16.gag.{mode}"), *pair)
            for i, (seed, shape) in enumerate(((2, (2,)), (3, (1, 3)))):
                assert got[i].dtype == tf.uint16
                np.testing.assert_array_equal(got[i].numpy(),
                                              np.concatenate([values(seed, r, shape) for r in range(S)]))
        chk.check(f"uint16 allgather, grouped_allgather ({mode})", allgathers)

        def broadcast_alltoall(mode=mode):
            got = run(mode, lambda t: hvd.broadcast(t, S - 1, name=f"u16.bc.{mode}"), tf.constant(values(4, R, (3,))))
            assert got.dtype == tf.uint16
            np.testing.assert_array_equal(got.numpy(), values(4, S - 1, (3,)))
            mine = tf.constant(values(5, R, (2 * S, 2)))
            got = run(mode, lambda t: hvd.alltoall(t, name=f"u16.a2a.{mode}"), mine)
            expected = np.concatenate([values(5, r, (2 * S, 2))[2 * R:2 * R + 2] for r in range(S)])
            assert got.dtype == tf.uint16
            np.testing.assert_array_equal(got.numpy(), expected)
        chk.check(f"uint16 broadcast, alltoall ({mode})", broadcast_alltoall)


# ---------------------------------------------------------------- IndexedSlices

def family_slices():
    for mode in MODES:
        def integer_average(mode=mode):
            slices = tf.IndexedSlices(tf.constant([[4, 6]], tf.int32), tf.constant([R], tf.int64),
                                      dense_shape=tf.constant([S, 2], tf.int64))
            got = run(mode, lambda v, i: hvd.allreduce(tf.IndexedSlices(v, i, slices.dense_shape),
                                                       op=hvd.Average, name=f"slices.{mode}").values,
                      slices.values, slices.indices)
            assert got.dtype == tf.float64, got.dtype  # TensorFlow's true division of int32, as in Horovod
            np.testing.assert_array_equal(got.numpy(), np.tile([[4 / S, 6 / S]], (S, 1)))
        chk.check(f"IndexedSlices Average of int32 values ({mode})", integer_average)

    def scale_factors():
        slices = tf.IndexedSlices(tf.ones([1, 2]), tf.constant([0], tf.int64),
                                  dense_shape=tf.constant([2, 2], tf.int64))
        for kw in ({"prescale_factor": 2.0}, {"postscale_factor": 0.5}):
            raises(NotImplementedError, lambda: hvd.allreduce(slices, **kw), "not supported with tf.IndexedSlices")
    chk.check("IndexedSlices with pre/postscale factors: NotImplementedError", scale_factors)


# ---------------------------------------------------------------- errors

def family_errors():
    def eager():
        x = tf.ones([R + 1])
        e = raises(tf.errors.FailedPreconditionError, lambda: hvd.allreduce(x, name="err.shape"), "err.shape")
        assert isinstance(e, collectives.TensorMismatchError) and isinstance(e, collectives.CollectivesError)
        again = pickle.loads(pickle.dumps(e))
        assert type(again) is type(e) and str(again) == str(e)
        e = raises(tf.errors.FailedPreconditionError,
                   lambda: hvd.allreduce(tf.ones([2], tf.float32 if R == 0 else tf.float64), name="err.dtype"))
        assert isinstance(e, collectives.TensorMismatchError)
        e = raises(tf.errors.InvalidArgumentError, lambda: hvd.broadcast(tf.ones([2]), S, name="err.root"))
        assert isinstance(e, collectives.InvalidArgumentError) and isinstance(e, ValueError)
        e = raises(tf.errors.InvalidArgumentError,
                   lambda: hvd.alltoall(tf.ones([3, 2]), splits=[3] + [1] * (S - 1), name="err.splits"))
        assert isinstance(e, collectives.CollectivesError)
        e = raises(tf.errors.FailedPreconditionError,
                   lambda: hvd.broadcast(tf.ones([2]), R % 2 if S > 1 else 0, name="err.rootmismatch"))
        assert isinstance(e, collectives.TensorMismatchError)
        # the engine keeps working
        assert hvd.allreduce(tf.ones([2]), op=hvd.Sum, name="err.after").numpy().tolist() == [S, S]
    chk.check("eager errors: FailedPrecondition / InvalidArgument, also collectives errors", eager)

    def in_function():
        x = tf.ones([R + 1])
        e = raises(tf.errors.UnknownError, lambda: tf.function(lambda t: hvd.allreduce(t, name="errf.shape"))(x))
        assert "TensorMismatchError" in str(e)
        raises(tf.errors.InvalidArgumentError,
               lambda: tf.function(lambda t: hvd.broadcast(t, S, name="errf.root"))(tf.ones([2])))
        assert hvd.allreduce(tf.ones([2]), op=hvd.Sum, name="errf.after").numpy().tolist() == [S, S]
    chk.check("tf.function errors: UnknownError (mismatch) / InvalidArgumentError (bad root)", in_function)


# ---------------------------------------------------------------- iterations

def family_iterations():
    def counts_updates_like_keras():
        passes, steps = 2, 2
        grads_of = [[tf.constant(rank_input(10 + k, r, (3,), np.float32)) for r in range(S)]
                    for k in range(passes * steps)]
        var = keras.Variable(np.zeros(3, np.float32))
        opt = hvd_keras.DistributedOptimizer(keras.optimizers.Adam(0.5), backward_passes_per_step=passes,
                                             average_aggregated_gradients=True)
        # the reference: one process, Keras 3's own accumulation of each micro-batch's mean over ranks
        ref_var = keras.Variable(np.zeros(3, np.float32))
        ref = keras.optimizers.Adam(0.5, gradient_accumulation_steps=passes)
        for k in range(passes * steps):
            opt.apply([grads_of[k][R]], [var])
            ref.apply([tf.add_n(grads_of[k]) / S], [ref_var])
            assert int(opt.iterations) == int(ref.iterations) == (k + 1) // passes, (k, int(opt.iterations))
            np.testing.assert_allclose(var.numpy(), ref_var.numpy(), rtol=1e-5, atol=1e-6)
    chk.check("backward_passes_per_step=2: iterations counts updates, as Keras 3's gradient accumulation",
              counts_updates_like_keras)


# ---------------------------------------------------------------- local variables

def two_layer_model(seed):
    keras.utils.set_random_seed(seed)
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2, name="shared"),
                              keras.layers.Dense(1, name="local")])
    return model


def family_local():
    xs = [rank_input(20, r, (4, 3), np.float32) for r in range(S)]

    def grads_of(model, x):
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(model(x))
        return tape.gradient(loss, model.trainable_variables)

    for mode in MODES:
        def partial_tape(mode=mode):
            model = two_layer_model(0)
            mine = [g.numpy() for g in grads_of(model, xs[R])]
            every = [[g.numpy() for g in grads_of(model, x)] for x in xs]

            def reduced(x):
                with tf.GradientTape() as tape:
                    loss = tf.reduce_sum(model(x))
                tape = hvd.PartialDistributedGradientTape(tape, local_layers=model.get_layer("local"))
                return tape.gradient(loss, model.trainable_variables)
            got = run(mode, reduced, tf.constant(xs[R]))
            for i, g in enumerate(got):
                if i < 2:  # shared kernel, bias: averaged
                    np.testing.assert_allclose(g.numpy(), np.mean([e[i] for e in every], axis=0), rtol=1e-5)
                else:  # local: this rank's own, divided by the number of ranks (scale_local_gradients)
                    np.testing.assert_allclose(g.numpy(), mine[i] / S, rtol=1e-5)
        chk.check(f"PartialDistributedGradientTape(local_layers=...) ({mode})", partial_tape)

    def register_source_unscaled():
        v = tf.Variable(float(R + 1))
        w = tf.Variable(float(R + 1))
        with tf.GradientTape() as tape:
            loss = v * 2.0 + w * 3.0
        tape = hvd.DistributedGradientTape(tape, scale_local_gradients=False)
        tape.register_local_source(w)
        gv, gw = tape.gradient(loss, [v, w])
        assert float(gv) == 2.0 and float(gw) == 3.0
        raises(ValueError, lambda: hvd.PartialDistributedGradientTape(tf.GradientTape(), local_layers=[object()]),
               "tf.keras.layers.Layer")
    chk.check("register_local_source, scale_local_gradients=False", register_source_unscaled)

    def partial_optimizer():
        model = two_layer_model(1)
        every = [[g.numpy() for g in grads_of(model, x)] for x in xs]
        before = [v.numpy().copy() for v in model.trainable_variables]
        opt = hvd_keras.PartialDistributedOptimizer(keras.optimizers.SGD(1.0), local_layers=[model.get_layer("local")])
        opt.apply(grads_of(model, tf.constant(xs[R])), model.trainable_variables)
        for i, v in enumerate(model.trainable_variables):
            step = np.mean([e[i] for e in every], axis=0) if i < 2 else every[R][i] / S
            np.testing.assert_allclose(v.numpy(), before[i] - step, rtol=1e-5, atol=1e-6)
    chk.check("keras PartialDistributedOptimizer(local_layers=...)", partial_optimizer)

    def callback_local_variables():
        model = two_layer_model(100 + R)  # different on every rank
        model.compile(optimizer=hvd_keras.DistributedOptimizer(keras.optimizers.SGD(0.0)), loss="mse")
        local = model.get_layer("local").kernel
        mine = local.numpy().copy()
        callback = hvd_keras.callbacks.BroadcastGlobalVariablesCallback(0, local_variables=[local])
        model.fit(np.zeros((2, 3), np.float32), np.zeros((2, 1), np.float32), epochs=1, verbose=0,
                  callbacks=[callback])
        np.testing.assert_array_equal(local.numpy(), mine)  # kept (learning rate 0)
        shared = model.get_layer("shared").kernel.numpy()
        np.testing.assert_array_equal(shared, two_layer_model(100).get_layer("shared").kernel.numpy())
    chk.check("BroadcastGlobalVariablesCallback(local_variables=...)", callback_local_variables)

    def best_model_checkpoint():
        path = os.path.join(tempfile.mkdtemp(), f"best.{R}.keras")
        model = two_layer_model(2)
        model.compile(optimizer=keras.optimizers.SGD(0.01), loss="mse")
        callback = hvd_keras.callbacks.BestModelCheckpoint(monitor="loss", filepath=path)
        assert callback.save_best_only and not callback.save_weights_only
        model.fit(np.ones((4, 3), np.float32), np.ones((4, 1), np.float32), epochs=2, verbose=0,
                  callbacks=[callback])
        assert os.path.exists(path)
        unset = hvd_keras.callbacks.BestModelCheckpoint()
        raises(ValueError, lambda: model.fit(np.ones((4, 3)), np.ones((4, 1)), epochs=1, verbose=0,
                                             callbacks=[unset]), "filepath")
    chk.check("callbacks.BestModelCheckpoint", best_model_checkpoint)


# ---------------------------------------------------------------- drop-in gaps (issue 35)

def family_dropin():
    first = hvd.add_process_set(list(range(S - 1)))  # every rank but the last
    inside = R < S - 1

    def set_ops():
        # Horovod's size_op counts the set's ranks, also on a rank outside it; -3 for an unknown id.
        assert int(hvd.size_op()) == S
        assert int(hvd.size_op(process_set_id=first.process_set_id)) == S - 1
        assert int(tf.function(lambda: hvd.size_op(first.process_set_id))()) == S - 1
        assert int(hvd.size_op(99)) == -3
        assert int(hvd.process_set_included_op(first.process_set_id)) == int(inside)
        # rank_op, local_size_op and local_rank_op take no set: job-wide values, as Horovod's
        assert (int(hvd.rank_op()), int(hvd.local_rank_op()), int(hvd.local_size_op())) == \
            (R, hvd.local_rank(), hvd.local_size())
    chk.check("size_op / process_set_included_op of a process set on every rank", set_ops)

    def common_names():
        assert hvd.gpu_available("tensorflow") is bool(tf.config.list_physical_devices("GPU"))
        assert hvd.gpu_available("mxnet") is False
        assert collectives.tensorflow.mpi_ops.gpu_available is hvd.gpu_available
        assert hvd.split_list(list(range(5)), 3) == [[0, 1], [2, 3], [4]]
        assert hvd_keras.is_version_greater_equal_than(tf.__version__, "2.0.0")
        assert not hvd_keras.is_version_greater_equal_than("2.9.1", "2.11.0")
        raises(ValueError, lambda: hvd_keras.is_version_greater_equal_than("2.9", "2.11"), "major.minor.patch")
    chk.check("horovod.common.util's names: gpu_available, split_list, is_version_greater_equal_than", common_names)

    xs = [rank_input(30, r, (4, 3), np.float32) for r in range(S)]

    def grads_of(model, x):
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(model(x))
        return tape, loss

    def expected(model):
        """Set members average over the set; the rank outside keeps its own gradients."""
        every = []
        for x in xs:
            tape, loss = grads_of(model, x)
            every.append([g.numpy() for g in tape.gradient(loss, model.trainable_variables)])
        if not inside:
            return every[R]
        return [np.mean([every[r][i] for r in first.ranks], axis=0) for i in range(len(every[R]))]

    def tape_outside_set():
        model = two_layer_model(3)
        tape, loss = grads_of(model, tf.constant(xs[R]))
        got = hvd.DistributedGradientTape(tape, process_set=first).gradient(loss, model.trainable_variables)
        for g, want in zip(got, expected(model)):
            np.testing.assert_allclose(g.numpy(), want, rtol=1e-5, atol=1e-6)
    chk.check("DistributedGradientTape of a set: members average, the rank outside keeps its own", tape_outside_set)

    def keras_optimizer_per_set():
        for face in (hvd, hvd_keras):
            model = two_layer_model(4)
            want = [v.numpy() - 0.1 * g for v, g in zip(model.trainable_variables, expected(model))]
            opt = face.DistributedOptimizer(keras.optimizers.SGD(0.1), process_set=first)
            tape, loss = grads_of(model, tf.constant(xs[R]))
            opt.apply_gradients(zip(tape.gradient(loss, model.trainable_variables), model.trainable_variables))
            for v, w in zip(model.trainable_variables, want):
                np.testing.assert_allclose(v.numpy(), w, rtol=1e-5, atol=1e-6)
    chk.check("Keras DistributedOptimizer of a set on every rank", keras_optimizer_per_set)
    chk.check("remove the set", lambda: hvd.remove_process_set(first))

    def float_splits():
        # Horovod refuses non-integer splits whatever their values; here on every rank, and when
        # only the last rank passes them, the others get the mismatch naming it, nobody waits.
        x = tf.ones([2 * S, 2])
        for label, bad in (("all", True), ("last", R == S - 1)):
            splits = tf.fill([S], 2.0) if bad else tf.fill([S], 2)
            name = f"dropin.splits.{label}"
            if bad:
                e = raises(ValueError, lambda: hvd.alltoall(x, splits=splits, name=name), "integers")
                assert isinstance(e, tf.errors.InvalidArgumentError) and "float32" in str(e), e
            else:
                e = raises(tf.errors.FailedPreconditionError, lambda: hvd.alltoall(x, splits=splits, name=name))
                assert f"rank {S - 1}" in str(e) and "integers" in str(e), e
        assert hvd.allreduce(tf.ones([2]), op=hvd.Sum, name="dropin.after").numpy().tolist() == [S, S]
    chk.check("alltoall with float splits: a typed error on every rank", float_splits)


FAMILIES = {"names": family_names, "rsgrad": family_rsgrad, "uint16": family_uint16, "slices": family_slices,
            "errors": family_errors, "iterations": family_iterations, "local": family_local,
            "dropin": family_dropin}


def main():
    for fam in sys.argv[1:]:
        FAMILIES[fam]()
    hvd.shutdown()
    chk.finish()


if __name__ == "__main__":
    main()
