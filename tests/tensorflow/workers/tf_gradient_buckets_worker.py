"""The TensorFlow gradient reducer's flat buckets (adapters/tensorflow/gradient_buckets.py), for
tests/tensorflow/test_tf_gradient_buckets.py: one group holding several dtypes (one buffer each, a grouped
request), 0-d and empty gradients, every grouping (None, 2, 3) and op, eagerly and inside
tf.function (twice: the cached plan), against float64 numpy references from every rank's inputs.
Traced, they run in the engine's TensorFlow op (csrc/tensorflow/tensorflow_kernels.cc); the graph is checked
for it.
"""
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import collectives.tensorflow as hvd  # noqa: E402
from collectives.adapters.tensorflow.gradient_reducer import GradientReducer  # noqa: E402
from common import Checker  # noqa: E402

SHAPES = [(7, 3), (), (0,), (5,), (33,), (2, 2, 2), (1000,)]
DTYPES = [tf.float32, tf.float32, tf.float32, tf.float16, tf.float64, tf.bfloat16, tf.float32]
OPS = {"Average": (hvd.Average, lambda s: s.mean(0)), "Sum": (hvd.Sum, lambda s: s.sum(0)),
       "Max": (hvd.Max, lambda s: s.max(0))}


def gradients(rank):
    rng = np.random.default_rng([7, rank])
    return [tf.cast(tf.constant(rng.normal(size=s)), d) for s, d in zip(SHAPES, DTYPES)]


def main():
    hvd.init()
    rank, size = hvd.rank(), hvd.size()
    chk = Checker(rank)
    everyone = [[t.numpy().astype(np.float64) for t in gradients(k)] for k in range(size)]
    for groups in (None, 2, 3):
        for opname, (op, ref_of) in OPS.items():
            label = f"groups={groups} {opname}"

            def one(groups=groups, op=op, ref_of=ref_of, label=label):
                reducer = GradientReducer(f"buckets.{groups}.{opname}", op=op, groups=groups)
                mine = gradients(rank)
                traced = tf.function(lambda ts: reducer.reduce(ts))
                for how, out in (("eager", reducer.reduce(mine)), ("traced", traced(mine)),
                                 ("traced again", traced(mine))):
                    assert len(out) == len(SHAPES), f"{label} {how}: {len(out)} results"
                    if how != "eager":
                        types = {o.type for o in traced.get_concrete_function(mine).graph.get_operations()}
                        assert "CollectivesReduceGradients" in types, f"{label} {how}: not through the engine's op"
                    for i, got in enumerate(out):
                        what = f"{label} {how} gradient {i} ({DTYPES[i].name}{SHAPES[i]})"
                        assert got.dtype == DTYPES[i] and tuple(got.shape) == SHAPES[i], (what, got.dtype, got.shape)
                        ref = ref_of(np.stack([e[i] for e in everyone]))
                        tol = {tf.float16: 1e-2, tf.bfloat16: 2e-2}.get(DTYPES[i], 1e-6)
                        np.testing.assert_allclose(got.numpy().astype(np.float64), ref, rtol=tol, atol=tol,
                                                   err_msg=what)

            chk.check(label, one)
    hvd.shutdown()
    chk.finish()


if __name__ == "__main__":
    main()
