"""TensorFlow 1 graphs are refused at graph-build time; eager and tf.function keep working
(run under mpirun, one process per rank).

The failing case of issue 11 item 12: unnamed collectives built into a graph and run by a
``tf.compat.v1.Session``, which runs independent ops in a different order on each rank (wrong
pairings, then a hang). Here every verb built in a TF1 graph must raise
``GraphModeNotSupportedError`` while the graph is built, leave no collective op in the graph,
and leave the ranks in step: the eager and tf.function cases that follow, unnamed, check
their values against numpy. The last case switches the whole process to graph mode
(``disable_eager_execution``), the other way TF1 programs start.
"""
import faulthandler
import sys

# A hang prints every thread's stack (then exits) well before the test's hard timeout kills the job.
faulthandler.enable(file=sys.stderr)
faulthandler.dump_traceback_later(180, exit=True, file=sys.stderr)

import numpy as np  # noqa: E402

import collectives  # noqa: E402
import collectives.tensorflow as hvd  # noqa: E402

hvd.init()

import tensorflow as tf  # noqa: E402

import collectives.keras as hvd_keras  # noqa: E402
from common import Checker, rank_input  # noqa: E402

R, S = hvd.rank(), hvd.size()
chk = Checker(R)


def refused(build, label):
    """``build()`` inside a fresh TF1 graph raises GraphModeNotSupportedError (a CollectivesError)
    and adds no collectives op to the graph."""
    graph = tf.Graph()
    with graph.as_default():
        try:
            build()
        except hvd.GraphModeNotSupportedError as e:
            assert isinstance(e, collectives.CollectivesError)
            assert "TensorFlow 1 graph" in str(e), str(e)
        else:
            raise AssertionError(f"{label}: built in a TF1 graph without GraphModeNotSupportedError")
    hops = [op.name for op in graph.get_operations() if op.type in ("EagerPyFunc", "PyFunc", "PyFuncStateless")]
    assert not hops, f"{label}: collectives ops left in the graph: {hops}"


def x(seed, shape=(3,)):
    return tf.constant(rank_input(seed, R, shape, np.float32))


def ref_sum(seed, shape=(3,)):
    return sum(rank_input(seed, r, shape, np.float32) for r in range(S))


def graph_cases():
    def issue_case():
        # Two unnamed allreduces and their gradient, to be run by a session: refused while built.
        def build():
            a = tf.compat.v1.placeholder(tf.float32, [3])
            b = tf.compat.v1.placeholder(tf.float32, [3])
            outs = [hvd.allreduce(a, op=hvd.Sum), hvd.allreduce(b, op=hvd.Sum)]
            tf.compat.v1.Session().run(outs, {a: np.ones(3), b: np.ones(3)})
        refused(build, "two unnamed allreduces in a session")
    chk.check("TF1 session with unnamed allreduces: refused at graph-build time", issue_case)

    builders = {
        "allreduce": lambda: hvd.allreduce(x(1), name="g.allreduce"),
        "grouped_allreduce": lambda: hvd.grouped_allreduce([x(2), x(3)]),
        "allgather": lambda: hvd.allgather(x(4)),
        "grouped_allgather": lambda: hvd.grouped_allgather([x(4)]),
        "broadcast": lambda: hvd.broadcast(x(5), 0),
        "alltoall": lambda: hvd.alltoall(tf.zeros([S, 2])),
        "reducescatter": lambda: hvd.reducescatter(tf.zeros([S, 2])),
        "grouped_reducescatter": lambda: hvd.grouped_reducescatter([tf.zeros([S, 2])]),
        "join": hvd.join,
        "barrier": hvd.barrier,
        "keras allreduce": lambda: hvd_keras.allreduce(np.ones(2, np.float32)),
    }
    for verb, build in builders.items():
        chk.check(f"TF1 graph: {verb} refused", lambda build=build, verb=verb: refused(build, verb))

    def variables():
        def build():
            v = tf.compat.v1.Variable(np.full(3, float(R), np.float32))
            hvd.broadcast_([v], root_rank=0)
        refused(build, "broadcast_")

        def build_variables():
            v = tf.compat.v1.Variable(np.full(3, float(R), np.float32))
            hvd.broadcast_variables([v], root_rank=0)
        refused(build_variables, "broadcast_variables")

        def build_global():
            tf.compat.v1.Variable(np.zeros(2, np.float32))
            hvd.broadcast_global_variables(0)
        refused(build_global, "broadcast_global_variables")
        refused(lambda: hvd.broadcast_global_variables(0), "broadcast_global_variables without variables")
    chk.check("TF1 graph: broadcast_, broadcast_variables, broadcast_global_variables refused", variables)

    def gradient_tape():
        def build():
            v = tf.compat.v1.Variable(np.ones(3, np.float32))
            with tf.GradientTape() as tape:
                loss = tf.reduce_sum(v * v)
            hvd.DistributedGradientTape(tape).gradient(loss, [v])
        refused(build, "DistributedGradientTape")
    chk.check("TF1 graph: DistributedGradientTape refused", gradient_tape)

    def function_in_graph():
        fn = tf.function(lambda t: hvd.allreduce(t))
        refused(lambda: fn(x(6)), "tf.function called from a TF1 graph")
    chk.check("TF1 graph: a tf.function called from it refused too", function_in_graph)


def still_working():
    def eager_unnamed():
        for seed in (10, 11):
            out = hvd.allreduce(x(seed), op=hvd.Sum)
            np.testing.assert_array_equal(out.numpy(), ref_sum(seed))
    chk.check("eager unnamed allreduces after the refusals", eager_unnamed)

    def function_unnamed():
        @tf.function
        def two(a, b):
            return hvd.allreduce(a, op=hvd.Sum), hvd.allreduce(b, op=hvd.Average)

        for _ in range(2):
            s, avg = two(x(12), x(13))
            np.testing.assert_array_equal(s.numpy(), ref_sum(12))
            np.testing.assert_allclose(avg.numpy(), ref_sum(13) / S, rtol=1e-6)
    chk.check("tf.function with two unnamed allreduces (twice)", function_unnamed)

    def function_gradient_and_broadcast():
        v = tf.Variable(rank_input(14, R, (3,), np.float32))

        @tf.function
        def step():
            with tf.GradientTape() as tape:
                loss = tf.reduce_sum(hvd.allreduce(v * v, op=hvd.Sum))
            grad = tape.gradient(loss, v)
            hvd.broadcast_variables([v], root_rank=S - 1)
            return grad

        grad = step().numpy()
        # d/dv of sum over ranks of v_r^2, with Horovod's allreduce gradient (the upstream
        # gradient, ones, Sum-allreduced over the ranks): 2 * v * size.
        np.testing.assert_allclose(grad, 2 * rank_input(14, R, (3,), np.float32) * S, rtol=1e-6)
        np.testing.assert_array_equal(v.numpy(), rank_input(14, S - 1, (3,), np.float32))
    chk.check("tf.function: gradient through allreduce, broadcast_variables assigns", function_gradient_and_broadcast)


def disabled_eager():
    # Last: TensorFlow cannot go back to eager execution in this process afterwards.
    def build():
        tf.compat.v1.disable_eager_execution()
        assert not tf.executing_eagerly()
        try:
            hvd.allreduce(tf.constant([1.0, 2.0]))
        except hvd.GraphModeNotSupportedError as e:
            assert "TensorFlow 1 graph" in str(e), str(e)
        else:
            raise AssertionError("allreduce built with eager execution disabled")
    chk.check("disable_eager_execution(): refused", build)


def main():
    graph_cases()
    still_working()
    disabled_eager()
    hvd.shutdown()
    chk.finish()


if __name__ == "__main__":
    main()
