"""TensorFlow 1 graphs (issue 11 item 12) on 2 real MPI ranks: never silently wrong, never a
deadlock. collectives refuses them when the graph is built (GraphModeNotSupportedError on
every rank, no op left in the graph) -- the unnamed allreduces of a tf.compat.v1 session that
gave wrong values and hung before included -- and eager execution and tf.function keep
working, checked against numpy right after the refusals. See tests/tensorflow/workers/tf_graph_mode_worker.py.
"""
import importlib.util

import pytest

from mpi_launch import assert_all_ranks_passed, run_workers

# find_spec, not importorskip: the ranks import TensorFlow, pytest need not (seconds saved).
pytestmark = pytest.mark.skipif(importlib.util.find_spec("tensorflow") is None, reason="TensorFlow not installed")

TF_ENV = {"TF_CPP_MIN_LOG_LEVEL": "2", "TF_ENABLE_ONEDNN_OPTS": "0", "COLLECTIVES_STALL_SHUTDOWN_TIME_SECONDS": "60"}


def test_tf1_graphs_refused_eager_and_function_work():
    run = run_workers(2, "tf_graph_mode_worker.py", timeout=240, env=TF_ENV)
    assert_all_ranks_passed(run, 2, min_cases=19)
