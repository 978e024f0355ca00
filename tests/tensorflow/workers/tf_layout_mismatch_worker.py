"""A gradient whose shape differs between ranks (the model differs: a user bug), for
tests/tensorflow/test_tensorflow_layout_mismatch.py. Argument: "op" (the engine's TensorFlow op inside a
tf.function) or "fallback" (COLLECTIVES_TENSORFLOW_KERNELS=0: the tf.py_function hop).

Rank 1's model has one variable of another shape. The reducers' one-time layout check
(csrc/frontend/layout_check.h) must fail every rank with the typed mismatch error, naming the gradient and
its shapes, instead of leaving the ranks waiting for each other under different names. Each rank
prints one line per case: "CAUGHT <case> <rank> <exception class> [<its TensorFlow and
collectives classes>]: <message>" (or "NOERROR <case> <rank>"),
which the test checks on every rank. Then the same code with equal shapes works, and a timeline
of several steps shows the layout check ran once, or not at all for a new trace of an agreed
layout on rank 0 alone (rank 0 prints "TIMELINE <case> <checks> <reductions>"). The lines also
go to $LAYOUT_TEST_OUT/rank<R>.txt.
"""
import json
import os
import sys
import tempfile
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import collectives.tensorflow as hvd  # noqa: E402
from collectives.adapters.tensorflow import engine_ops  # noqa: E402
from common import Checker  # noqa: E402

MODE = sys.argv[1]
STEPS = 3
# One file per rank for the lines the test reads (lines printed by several ranks at once can
# interleave in mpirun's output).
OUT_DIR = os.environ.get("LAYOUT_TEST_OUT", tempfile.gettempdir())


def emit(rank, line):
    print(line, flush=True)
    with open(os.path.join(OUT_DIR, f"rank{rank}.txt"), "a") as f:
        f.write(line + "\n")


def report(case, fn, rank):
    """Runs ``fn``, prints what it raised on one line, and meets every rank."""
    try:
        fn()
        emit(rank, f"NOERROR {case} {rank}")
    except Exception as error:  # noqa: BLE001 - the test judges what each rank caught
        text = " ".join(str(error).split())
        kinds = ",".join(c.__name__ for c in type(error).__mro__ if c.__module__.startswith(("tensorflow", "collectives")))
        emit(rank, f"CAUGHT {case} {rank} {type(error).__name__} [{kinds}]: {text}")
    hvd.barrier()


def quiet_period():
    """Every rank waits, idle, for longer than the stall check time (the test sets it short): a
    request that a failed case left pending -- it would have waited since that case -- shows up
    as a stall warning by the end of it, which the test looks for. One period after all the
    mismatch cases rather than one per case: a stall warning names the request, and a period
    per case cost CI 24 s."""
    hvd.barrier()
    time.sleep(float(os.environ.get("LAYOUT_TEST_QUIET_S", "4")))
    hvd.barrier()


def tape_variables(rank, differ, width=5):
    """Two variables; with ``differ``, rank 1's second has ``width + 1`` elements instead of
    ``width``. (A layout is checked once per engine, whoever reduces it: each equal-shapes case
    uses a width of its own.)"""
    return [tf.Variable(np.full((4, 3), 0.5, np.float32)),
            tf.Variable(np.ones(width + 1 if differ and rank == 1 else width, np.float32))]


def tape_gradients(variables, **kwargs):
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(variables[0] * 2.0) + tf.reduce_sum(variables[1] * 3.0)
    tape = hvd.DistributedGradientTape(tape, **kwargs)
    return tape.gradient(loss, variables)


def traced_tape_step(variables, **kwargs):
    @tf.function
    def step():
        return tape_gradients(variables, **kwargs)
    return step


def sparse_step(rank, differ):
    """An embedding lookup: an IndexedSlices gradient, whose rows may differ but whose row width
    must not (rank 1's is 5 wide instead of 4 with ``differ``)."""
    table = tf.Variable(np.ones((10, 5 if differ and rank == 1 else 4), np.float32))
    dense = tf.Variable(np.ones(3, np.float32))

    def step():
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(tf.gather(table, [rank % 10, 2])) + tf.reduce_sum(dense)
        return hvd.DistributedGradientTape(tape).gradient(loss, [dense, table])
    return step


def keras_model(rank, differ):
    import keras
    keras.utils.set_random_seed(3)
    hidden = 5 if differ and rank == 1 else 4
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(hidden, activation="tanh"), keras.layers.Dense(1)])
    model.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.SGD(0.1)), loss="mse")
    rng = np.random.default_rng(5)
    return model, rng.normal(size=(8, 3)).astype(np.float32), rng.normal(size=(8, 1)).astype(np.float32)


def fit(model, x, y):
    model.fit(x, y, batch_size=4, epochs=1, shuffle=False, verbose=0)


def expect_path(step):
    types = {o.type for o in step.get_concrete_function().graph.get_operations()}
    want = "CollectivesReduceGradients" if MODE == "op" else "EagerPyFunc"
    assert want in types, f"expected {want} in the traced step, found {sorted(types)}"


def timeline_counts(path, check_suffix=".layout"):
    """(layout checks, gradient reductions) that rank 0's timeline recorded."""
    with open(path) as f:
        events = json.load(f)
    pids = {e["pid"]: e["args"]["name"] for e in events if e["ph"] == "M" and e.get("name") == "process_name"}
    checks = sum(1 for e in events if e["ph"] == "B" and e["name"] == "ALLGATHER"
                 and pids.get(e["pid"], "").endswith(check_suffix))
    reductions = sum(1 for e in events if e["ph"] == "B" and e["name"] == "ALLREDUCE"
                     and pids.get(e["pid"], "").startswith(("DistributedGradientTape.", "DistributedOptimizer.")))
    return checks, reductions


def equal_shapes_with_timeline(rank, size, case, run_steps, expected_checks=1):
    """``run_steps()`` runs STEPS steps with equal shapes; rank 0's timeline must show
    ``expected_checks`` layout checks and every step's reduction."""
    # In this run's own directory: a name in the shared temporary directory could be another
    # job's (the ranks' parent pid is unique only among the processes of one pid namespace).
    path = os.path.join(OUT_DIR, f"timeline_{case}.json")
    hvd.start_timeline(path)
    run_steps()
    hvd.barrier()
    hvd.stop_timeline()
    if rank == 0:
        checks, reductions = timeline_counts(path)
        emit(rank, f"TIMELINE {case} {checks} {reductions}")
        assert checks == expected_checks, f"{case}: {checks} layout checks in {STEPS} steps"
        assert reductions >= STEPS, f"{case}: {reductions} reductions in {STEPS} steps"


def main():
    hvd.init()
    rank, size = hvd.rank(), hvd.size()
    chk = Checker(rank)

    # Mismatches: every rank must raise.
    if MODE == "op":
        report("eager-tape", lambda: tape_gradients(tape_variables(rank, True)), rank)
        report("eager-sparse", sparse_step(rank, True), rank)
    step = traced_tape_step(tape_variables(rank, True))
    chk.check("the traced tape uses the expected path", lambda: expect_path(step))
    report("function-tape", step, rank)
    model, x, y = keras_model(rank, True)
    report("keras-fit", lambda: fit(model, x, y), rank)
    if MODE == "op" and size > 2:
        subset = hvd.add_process_set([0, 1])
        report("process-set", traced_tape_step(tape_variables(rank, True), op=hvd.Sum, process_set=subset), rank)
        hvd.remove_process_set(subset)
    if MODE == "fallback" and size == 2:
        report("eager-adasum", lambda: tape_gradients(tape_variables(rank, True), op=hvd.Adasum), rank)
    quiet_period()

    # Equal shapes: the same code works, and the check runs once over several steps.
    variables = tape_variables(rank, False, width=7)
    step = traced_tape_step(variables)

    def traced_steps():
        for _ in range(STEPS):
            grads = step()
        np.testing.assert_allclose(grads[1].numpy(), np.full(7, 3.0), rtol=1e-6)

    chk.check("traced tape, equal shapes, one check", lambda: equal_shapes_with_timeline(rank, size, "function",
                                                                                       traced_steps))

    def retraced_on_rank_0():
        # A new trace (a new kernel or hop) of an agreed layout on one rank only must not check
        # alone: it would wait for ranks that do not check.
        mine = traced_tape_step(variables) if rank == 0 else step
        for _ in range(STEPS):
            grads = mine()
        np.testing.assert_allclose(grads[1].numpy(), np.full(7, 3.0), rtol=1e-6)

    chk.check("a retrace on one rank, no check", lambda: equal_shapes_with_timeline(rank, size, "retrace",
                                                                                  retraced_on_rank_0, 0))

    def eager_steps():
        vs = tape_variables(rank, False, width=8)
        for _ in range(STEPS):
            grads = tape_gradients(vs, op=hvd.Sum)
        np.testing.assert_allclose(grads[0].numpy(), np.full((4, 3), 2.0 * size), rtol=1e-6)

    chk.check("eager tape, equal shapes, one check", lambda: equal_shapes_with_timeline(rank, size, "eager",
                                                                                      eager_steps))

    def keras_steps():
        model, x, y = keras_model(rank, False)
        model.fit(x, y, batch_size=2, epochs=1, shuffle=False, verbose=0)  # 4 steps
        everyone = hvd.allgather_object([w.tobytes() for w in model.get_weights()])
        assert all(e == everyone[0] for e in everyone), "weights differ between ranks"

    chk.check("keras fit, equal shapes, one check", lambda: equal_shapes_with_timeline(rank, size, "keras",
                                                                                     keras_steps))
    if MODE == "op":
        def mixed_paths():
            # Rank 0 through the py_function hop, the others through the op: one check, same names.
            engine_ops.set_enabled(rank != 0)
            try:
                mixed = traced_tape_step(tape_variables(rank, False, width=9), op=hvd.Sum)
                for _ in range(STEPS):
                    grads = mixed()
                np.testing.assert_allclose(grads[1].numpy(), np.full(9, 3.0 * size), rtol=1e-6)
            finally:
                engine_ops.set_enabled(True)

        chk.check("hop on rank 0, op elsewhere, one check",
                  lambda: equal_shapes_with_timeline(rank, size, "mixed", mixed_paths))
    hvd.shutdown()
    chk.finish()


if __name__ == "__main__":
    main()
