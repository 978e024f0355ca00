"""Horovod's ``horovod.tensorflow`` submodules under ``collectives.tensorflow``: ``mpi_ops``,
``compression``, ``functions`` and ``sync_batch_norm`` import on their own (as a ported
``from horovod.tensorflow.mpi_ops import allgather`` does), are attributes of the face, and hold
the face's own objects. One process, no MPI job: importing needs no ``init()``."""
import subprocess
import sys

import pytest

pytest.importorskip("tensorflow")

SCRIPT = r"""
import importlib
import collectives.tensorflow as hvd
from collectives.tensorflow.mpi_ops import allgather, rank_op, size_op  # the ported import line
from collectives.tensorflow.compression import Compression, FP16Compressor, NoneCompressor
from collectives.tensorflow.functions import broadcast_variables, broadcast_object
from collectives.tensorflow.sync_batch_norm import SyncBatchNormalization

assert allgather is hvd.allgather and rank_op is hvd.rank_op and size_op is hvd.size_op
assert Compression is hvd.Compression and Compression.fp16 is FP16Compressor and Compression.none is NoneCompressor
assert broadcast_variables is hvd.broadcast_variables and broadcast_object is hvd.broadcast_object
assert SyncBatchNormalization is hvd.SyncBatchNormalization
for name in ("mpi_ops", "compression", "functions", "sync_batch_norm"):
    module = importlib.import_module("collectives.tensorflow." + name)
    assert getattr(hvd, name) is module, name
    for attr in module.__all__:
        face = getattr(hvd, attr, None)
        if attr.endswith("Compressor") and face is None:
            continue  # the face has Compression and Compressor only, as Horovod's
        assert face is getattr(module, attr), (name, attr)
print("SUBMODULES OK")
"""


def test_horovods_submodules_port_by_changing_the_import():
    run = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0 and "SUBMODULES OK" in run.stdout, run.stdout + run.stderr
