"""Error paths: cross-rank mismatches, duplicate names, pre-init use, unsupported dtypes and
bad roots. Each multi-rank scenario is one mpirun launch running many cases (see
workers/errors_worker.py); a case that hangs stops its rank with a 'HANG:' line.
"""
import json
import os
import re
import subprocess
import sys

import pytest

from mpi_launch import SUPPORT, run_workers, worker_path



def assert_all_passed(run, np_, at_least):
    """Every rank printed '[rank r] N passed, 0 failed' with N >= at_least."""
    for rank in range(np_):
        m = re.search(rf"\[rank {rank}\] (\d+) passed, (\d+) failed", run.stdout)
        assert m, f"rank {rank} printed no summary\n{run.describe()}"
        assert int(m.group(2)) == 0 and int(m.group(1)) >= at_least, run.describe()


@pytest.mark.parametrize("np_", [2, 3])
def test_mismatches_raise_on_every_rank(np_):
    """Shape (allreduce, broadcast, reducescatter), dtype, op type, reduce op, root,
    allgather trailing dims, prescale, grouped member, and cached names whose signature
    changes: TensorMismatchError on every rank within seconds, naming the tensor, the
    disagreeing rank and what differs; a normal allreduce works after each."""
    run = run_workers(np_, "errors_worker.py", "mismatch", timeout=240)
    assert_all_passed(run, np_, at_least=20)


def test_failed_handle_synchronized_twice_raises_again():
    """synchronize() of a handle whose op failed (mismatch) raises again the second time
    rather than returning None as if it had succeeded; a successful handle returns its result
    again."""
    run = run_workers(2, "errors_worker.py", "resync", timeout=120)
    assert_all_passed(run, 2, at_least=2)


def test_local_errors_duplicate_dtype_root():
    """DuplicateNameError for a name in flight (and reuse once synchronized); UnsupportedTypeError
    for complex/object/str/float128 on every verb and bool Sum; InvalidArgumentError for roots
    outside [0, size); rejected names stay free; the engine keeps working."""
    run = run_workers(2, "errors_worker.py", "local", timeout=240)
    assert_all_passed(run, 2, at_least=60)


# ----------------------------------------------------------------- before init()

@pytest.fixture(scope="module")
def preinit():
    """All entry points called before init(), in a fresh plain process (no mpirun)."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [SUPPORT, env.get("PYTHONPATH")]))
    proc = subprocess.run([sys.executable, worker_path("preinit_worker.py")], capture_output=True,
                          text=True, timeout=120, env=env)
    assert proc.returncode == 0, f"exit {proc.returncode}\n{proc.stdout}\n{proc.stderr}"
    return json.loads(proc.stdout.strip().splitlines()[-1])


PREINIT_CALLS = [
    "rank", "size", "local_rank", "local_size", "cross_rank", "cross_size",
    "allreduce", "allreduce_async", "allreduce_", "allreduce_async_", "grouped_allreduce",
    "grouped_allreduce_async", "broadcast", "broadcast_", "broadcast_async", "allgather", "allgather_async",
    "grouped_allgather", "alltoall", "alltoall_async", "reducescatter", "reducescatter_async",
    "grouped_reducescatter", "barrier", "broadcast_object", "allgather_object", "start_timeline",
    "stop_timeline", "unnamed_allreduce", "mpi_threads_supported",
]


@pytest.mark.parametrize("call", PREINIT_CALLS)
def test_before_init_raises_not_initialized(preinit, call):
    outcome = preinit[call]
    assert outcome != "ok", f"{call}() before init() did not raise"
    mro, message = outcome
    assert mro[0] == "NotInitializedError", f"{call}() raised {mro[0]}: {message}"
    assert "ValueError" in mro and "CollectivesError" in mro, mro
    assert "init" in message, message


def test_before_init_state(preinit):
    assert preinit["mpi_loaded_by_import"] is False, "importing collectives loaded MPI"
    assert preinit["is_initialized"] is False
    assert preinit["shutdown"] == "ok", preinit["shutdown"]
    assert preinit["is_initialized_after"] is False


def test_exception_hierarchy():
    import collectives as hvd

    assert issubclass(hvd.NotInitializedError, ValueError)
    assert issubclass(hvd.InvalidArgumentError, ValueError)
    assert issubclass(hvd.DuplicateNameError, ValueError)
    assert issubclass(hvd.UnsupportedTypeError, TypeError)
    assert issubclass(hvd.StallTimeoutError, TimeoutError)
    for cls in (hvd.NotInitializedError, hvd.InvalidArgumentError, hvd.DuplicateNameError,
                hvd.UnsupportedTypeError, hvd.TensorMismatchError, hvd.ShutdownError, hvd.StallTimeoutError):
        assert issubclass(cls, hvd.CollectivesError) and issubclass(cls, RuntimeError), cls
