"""A collectives error raised while a tf.function is traced keeps its type (autograph would
otherwise turn it into a generic StagingError). One process, started as a singleton MPI job."""
import os
import subprocess
import sys

import pytest

SCRIPT = """
import tensorflow as tf
import collectives.tensorflow as hvd
from collectives import UnsupportedTypeError
hvd.init()
try:
    tf.function(lambda x: hvd.allreduce(x))(tf.ones([2], tf.complex64))
except UnsupportedTypeError as e:
    print("OK", isinstance(e, TypeError))
"""


def test_error_type_survives_tf_function_tracing():
    pytest.importorskip("tensorflow")
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", TF_ENABLE_ONEDNN_OPTS="0")
    proc = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=120, env=env)
    assert proc.returncode == 0 and "OK True" in proc.stdout, proc.stdout + proc.stderr
