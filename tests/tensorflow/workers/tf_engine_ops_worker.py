"""The engine's TensorFlow op for gradients (csrc/tensorflow/tensorflow_kernels.cc, adapters/tensorflow/
engine_ops.py), for tests/tensorflow/test_tensorflow_engine_ops.py. Argument: "op" (expect the op in the
graph) or "fallback" (COLLECTIVES_TENSORFLOW_KERNELS=0: expect a tf.py_function instead).

Checked on every rank, against numpy references from every rank's inputs:
  - DistributedGradientTape in a tf.function, Average with gradient_predivide_factor (the
    scales travel as exact doubles), Sum, and a process set that is not the global one;
  - Keras model.fit with DistributedOptimizer: the weights stay identical on every rank and
    equal a single-process run on the concatenated batches;
  - ranks that reduce with different ops: tf.errors.FailedPreconditionError on every rank
    (tf.errors.UnknownError through the py_function);
  - after shutdown(), the traced step raises FailedPreconditionError; after init() again it
    reduces again;
  - shutdown() while a step waits in the op (its peers never run it) ends that step with
    tf.errors.AbortedError.
"""
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import collectives.tensorflow as hvd  # noqa: E402
from collectives.adapters.tensorflow import gradient_reducer  # noqa: E402
from common import Checker  # noqa: E402

MODE = sys.argv[1]
EXPECTED_OP = "CollectivesReduceGradients" if MODE == "op" else "EagerPyFunc"


# How many reductions were traced through each path (Keras' train step is a plain function that
# calls its own tf.function, so its graph is not at hand: count at trace time instead).
traced_through = {"CollectivesReduceGradients": 0, "EagerPyFunc": 0}


def _counting(fn, key):
    def counted(*args, **kwargs):
        traced_through[key] += 1
        return fn(*args, **kwargs)
    return counted


gradient_reducer.engine_ops.reduce_gradients = _counting(gradient_reducer.engine_ops.reduce_gradients,
                                                         "CollectivesReduceGradients")
gradient_reducer.run_hop = _counting(gradient_reducer.run_hop, "EagerPyFunc")


def op_types(fn, *args):
    return {o.type for o in fn.get_concrete_function(*args).graph.get_operations()}


def check_path(fn, *args):
    types = op_types(fn, *args)
    assert EXPECTED_OP in types, f"expected a {EXPECTED_OP} op in the graph, found {sorted(types)}"


def inputs_of(rank):
    rng = np.random.default_rng([11, rank])
    return [rng.normal(size=(4, 3)).astype(np.float32), rng.normal(size=(6,)).astype(np.float64)]


def tape_step(op, predivide=1.0, process_set=hvd.global_process_set):
    """A tf.function whose gradients are the inputs themselves (loss = sum(v * x))."""
    variables = [tf.Variable(np.zeros((4, 3), np.float32)), tf.Variable(np.zeros(6))]

    @tf.function
    def step(xs):
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(variables[0] * xs[0]) + tf.cast(tf.reduce_sum(variables[1] * xs[1]), tf.float32)
        tape = hvd.DistributedGradientTape(tape, op=op, gradient_predivide_factor=predivide,
                                           process_set=process_set)
        return tape.gradient(loss, variables)

    return step


def check_tape(rank, size):
    everyone = [inputs_of(k) for k in range(size)]
    mine = [tf.constant(a) for a in inputs_of(rank)]
    for label, op, predivide, reference in (
            ("Average", hvd.Average, 1.0, lambda s: s.mean(0)),
            ("Average, predivide 3", hvd.Average, 3.0, lambda s: s.mean(0)),
            ("Sum", hvd.Sum, 1.0, lambda s: s.sum(0))):
        step = tape_step(op, predivide)
        check_path(step, mine)
        for _ in range(2):  # the second run reuses the traced graph and the engine's cached response
            out = step(mine)
            for i, got in enumerate(out):
                want = reference(np.stack([e[i].astype(np.float64) for e in everyone]))
                np.testing.assert_allclose(got.numpy(), want, rtol=1e-6, atol=1e-6, err_msg=f"{label} gradient {i}")


def check_process_set(rank, size, subset):
    members = subset.ranks
    step = tape_step(hvd.Sum, process_set=subset)
    mine = [tf.constant(a) for a in inputs_of(rank)]
    if rank not in members or len(members) < 2:  # a set of one reduces nothing (nor does Horovod)
        return
    check_path(step, mine)
    out = step(mine)
    for i, got in enumerate(out):
        want = np.stack([inputs_of(k)[i].astype(np.float64) for k in members]).sum(0)
        np.testing.assert_allclose(got.numpy(), want, rtol=1e-6, atol=1e-6, err_msg=f"set {members} gradient {i}")


def check_keras_fit(rank, size):
    import keras

    def model_and_data():
        keras.utils.set_random_seed(3)
        model = keras.Sequential([keras.Input((5,)), keras.layers.Dense(4, activation="tanh"), keras.layers.Dense(1)])
        rng = np.random.default_rng(5)
        x = rng.normal(size=(8 * size, 5)).astype(np.float32)
        y = rng.normal(size=(8 * size, 1)).astype(np.float32)
        return model, x, y

    model, x, y = model_and_data()
    model.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.SGD(0.1)), loss="mse")
    mine = slice(rank * 8, (rank + 1) * 8)
    before = traced_through[EXPECTED_OP]
    model.fit(x[mine], y[mine], batch_size=4, epochs=1, shuffle=False, verbose=0)
    assert traced_through[EXPECTED_OP] > before, f"the Keras train step was not traced through {EXPECTED_OP}"

    # The same updates on one process: each step's gradient is the mean of the ranks' batch gradients,
    # which for mse over equal batches is the gradient over their concatenation.
    reference, _, _ = model_and_data()
    reference.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse")
    order = np.concatenate([np.arange(k * 8, k * 8 + 8).reshape(2, 4) for k in range(size)], axis=1).ravel()
    reference.fit(x[order], y[order], batch_size=4 * size, epochs=1, shuffle=False, verbose=0)
    for got, want in zip(model.get_weights(), reference.get_weights()):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    everyone = hvd.allgather_object([w.tobytes() for w in model.get_weights()])
    assert all(e == everyone[0] for e in everyone), "weights differ between ranks"


def check_mismatch(rank, size):
    # Rank 0 sums, the others average: the same names (the digest covers dtypes and shapes only),
    # so the engine sees the disagreement and fails the request everywhere. (A shape that differs
    # between ranks gives different names instead; the layout check catches it first:
    # tests/tensorflow/workers/tf_layout_mismatch_worker.py.)
    step = tape_step(hvd.Sum if rank == 0 else hvd.Average)
    mine = [tf.constant(a) for a in inputs_of(rank)]
    check_path(step, mine)
    try:
        step(mine)
    except tf.errors.FailedPreconditionError as error:
        assert MODE == "op" and "reduce ops" in str(error), (MODE, str(error))
    except tf.errors.UnknownError as error:
        # Inside a tf.function TensorFlow types a py_function's exception itself (errors.py).
        assert MODE == "fallback" and "TensorMismatchError" in str(error) and "reduce ops" in str(error), \
            (MODE, str(error))
    else:
        raise AssertionError("ranks reducing with different ops got no error")


def check_shutdown_and_init(rank, size):
    step = tape_step(hvd.Sum)
    mine = [tf.constant(a) for a in inputs_of(rank)]
    step(mine)
    hvd.shutdown()
    try:
        step(mine)
    except tf.errors.OpError as error:  # through the py_function, TensorFlow's own choice of type
        if MODE == "op":
            assert isinstance(error, tf.errors.FailedPreconditionError), type(error)
            assert "init" in str(error), str(error)
    else:
        raise AssertionError("a traced step ran after shutdown()")
    hvd.init()
    out = step(mine)
    want = np.stack([inputs_of(k)[0].astype(np.float64) for k in range(size)]).sum(0)
    np.testing.assert_allclose(out[0].numpy(), want, rtol=1e-6, atol=1e-6)


def check_shutdown_while_waiting(rank, size):
    """Rank 0 runs a traced step in a thread; the others never do. After 1 s rank 0 shuts down
    while its step waits in the op (the others shut down 2 s later): the step fails, with
    tf.errors.AbortedError through the op, within seconds; init() then starts again."""
    import threading
    import time

    step = tape_step(hvd.Sum)
    mine = [tf.constant(a) for a in inputs_of(rank)]
    step(mine)  # traced and run once everywhere
    hvd.barrier()
    outcome = {}
    thread = None
    if rank == 0:
        def run():
            try:
                step(mine)
                outcome["error"] = None
            except tf.errors.OpError as error:
                outcome["error"] = error
        thread = threading.Thread(target=run, daemon=True)
        thread.start()
    time.sleep(1.0 if rank == 0 else 3.0)
    alive_at_shutdown = thread is not None and thread.is_alive()
    hvd.shutdown()
    try:
        if rank == 0:
            assert alive_at_shutdown, f"the step ended without its peers: {outcome}"
            thread.join(timeout=30)
            assert not thread.is_alive(), "the step still waits 30 s after shutdown()"
            error = outcome.get("error")
            assert error is not None, "the step succeeded without its peers"
            if MODE == "op":
                assert isinstance(error, tf.errors.AbortedError), (type(error), str(error))
    finally:
        hvd.init()


def main():
    hvd.init()
    rank, size = hvd.rank(), hvd.size()
    chk = Checker(rank)
    subset = hvd.add_process_set(list(range(size - 1)) or [0])
    chk.check("tape: Average, predivide, Sum", lambda: check_tape(rank, size))
    chk.check("tape: a process set of ranks 0..size-2", lambda: check_process_set(rank, size, subset))
    chk.check("keras fit against one process", lambda: check_keras_fit(rank, size))
    chk.check("an op mismatch fails every rank", lambda: check_mismatch(rank, size))
    hvd.remove_process_set(subset)
    chk.check("shutdown, then init again", lambda: check_shutdown_and_init(rank, size))
    chk.check("shutdown while a step waits in the op", lambda: check_shutdown_while_waiting(rank, size))
    hvd.shutdown()
    chk.finish()


if __name__ == "__main__":
    main()
