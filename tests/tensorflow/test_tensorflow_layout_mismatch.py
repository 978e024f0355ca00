"""A gradient whose shape differs between ranks (the model differs between ranks) fails every rank
with the typed mismatch error naming the gradient and its shapes, instead of stalling: the
reducers' one-time layout check (csrc/frontend/layout_check.h), through the engine's TensorFlow op, the
py_function hop (COLLECTIVES_TENSORFLOW_KERNELS=0) and eagerly; DistributedGradientTape and Keras
model.fit with DistributedOptimizer. With equal shapes the same code works, the check runs once in
several steps, and a new trace of an agreed layout on one rank alone runs none (it would wait for
ranks that do not check) (tests/tensorflow/workers/tf_layout_mismatch_worker.py)."""
import os
import re

import pytest

from mpi_launch import assert_all_ranks_passed, run_workers

pytest.importorskip("tensorflow")

# A request left pending by a failed case is reported after the stall check time (3 s). After the
# mismatch cases every rank waits idle for longer than two check periods, so that a check falls
# more than one period after the last case (tests/tensorflow/workers/tf_layout_mismatch_worker.py).
ENV = {"COLLECTIVES_STALL_CHECK_TIME_SECONDS": "3", "LAYOUT_TEST_QUIET_S": "7"}


def worker_lines(out_dir, np):
    """What the ranks wrote to their files, one text (tests/tensorflow/workers/tf_layout_mismatch_worker.py)."""
    texts = []
    for r in range(np):
        path = os.path.join(out_dir, f"rank{r}.txt")
        assert os.path.exists(path), f"rank {r} wrote nothing"
        with open(path) as f:
            texts.append(f.read())
    return "".join(texts)


def caught(text):
    """{case: {rank: (class name, its TensorFlow and collectives classes, message)}} from the
    workers' CAUGHT and NOERROR lines."""
    out = {}
    for case, rank, name, kinds, message in re.findall(r"^CAUGHT (\S+) (\d+) (\S+) \[([^\]]*)\]: (.*)$",
                                                       text, re.M):
        out.setdefault(case, {})[int(rank)] = (name, kinds.split(","), message)
    for case, rank in re.findall(r"^NOERROR (\S+) (\d+)$", text, re.M):
        out.setdefault(case, {})[int(rank)] = ("NOERROR", [], "")
    return out


def check_mismatch(results, case, ranks, tf_class, shapes):
    """Every rank of ``ranks`` caught ``tf_class`` with a message naming ``shapes``."""
    got = results.get(case)
    assert got is not None, f"no rank reported case {case}"
    assert sorted(got) == sorted(ranks), f"{case}: ranks {sorted(got)} reported, expected {ranks}: {got}"
    for name, kinds, message in (got[r] for r in ranks):
        assert name != "NOERROR", f"{case}: a rank got no error: {got}"
        assert tf_class in kinds, f"{case}: {name} {kinds} is not {tf_class}: {message}"
        assert "Mismatched allreduce tensor shapes" in message, f"{case}: {message}"
        for s in shapes:
            assert s in message, f"{case}: '{s}' not in: {message}"
        assert "rank 1" in message, f"{case}: {message}"


def check_no_stalls(run):
    # A digest-named request ('.g<j>') submitted by the failed steps would stall.
    stalled = [line for line in run.stderr.splitlines() if "Stalled" in line and ".g" in line]
    assert not stalled, "\n".join(stalled)


def check_timeline(text, cases, unchecked=("retrace",)):
    lines = dict((c, (int(a), int(b))) for c, a, b in re.findall(r"^TIMELINE (\S+) (\d+) (\d+)$", text, re.M))
    for case in cases:
        assert case in lines, f"no timeline line for {case}:\n{text}"
        checks, reductions = lines[case]
        assert checks == 1 and reductions >= 3, (case, checks, reductions)
    for case in unchecked:  # a new trace of an agreed layout on one rank: no check
        assert lines.get(case, (None, 0))[0] == 0 and lines[case][1] >= 3, (case, lines.get(case))


def test_shape_mismatch_fails_every_rank_through_the_op(tmp_path):
    # Three ranks: rank 1 differs from ranks 0 and 2; a process set of ranks 0 and 1.
    run = run_workers(3, "tf_layout_mismatch_worker.py", "op", timeout=300,
                      env={**ENV, "LAYOUT_TEST_OUT": str(tmp_path)})
    assert_all_ranks_passed(run, 3, min_cases=6)
    text = worker_lines(tmp_path, 3)
    results = caught(text)
    check_mismatch(results, "eager-tape", [0, 1, 2], "FailedPreconditionError", ["gradient 1", "float32[5]", "float32[6]"])
    check_mismatch(results, "eager-tape", [0, 1, 2], "TensorMismatchError", ["ranks 0, 2"])
    check_mismatch(results, "eager-sparse", [0, 1, 2], "FailedPreconditionError",
                   ["gradient 1 (IndexedSlices values)", "float32[*, 4]", "float32[*, 5]"])
    check_mismatch(results, "function-tape", [0, 1, 2], "FailedPreconditionError", ["gradient 1", "float32[5]", "float32[6]"])
    check_mismatch(results, "keras-fit", [0, 1, 2], "FailedPreconditionError", ["gradient 0", "float32[3, 4]", "float32[3, 5]"])
    # Rank 2 is outside the set: its step reduces nothing and succeeds.
    got = results["process-set"]
    assert got.get(2, ("?",))[0] == "NOERROR", got
    check_mismatch({"p": {r: got[r] for r in (0, 1) if r in got}}, "p", [0, 1], "FailedPreconditionError",
                   ["float32[5]", "float32[6]", "process set"])
    check_no_stalls(run)
    check_timeline(text, ["function", "eager", "keras", "mixed"])


def test_shape_mismatch_fails_every_rank_through_the_py_function(tmp_path):
    run = run_workers(2, "tf_layout_mismatch_worker.py", "fallback", timeout=300,
                      env={**ENV, "COLLECTIVES_TENSORFLOW_KERNELS": "0", "LAYOUT_TEST_OUT": str(tmp_path)})
    assert_all_ranks_passed(run, 2, min_cases=5)
    text = worker_lines(tmp_path, 2)
    results = caught(text)
    # Inside a tf.function TensorFlow types a py_function's exception itself (docs/tensorflow.md).
    check_mismatch(results, "function-tape", [0, 1], "UnknownError", ["TensorMismatchError", "float32[5]", "float32[6]"])
    check_mismatch(results, "keras-fit", [0, 1], "UnknownError", ["TensorMismatchError", "float32[3, 4]", "float32[3, 5]"])
    check_mismatch(results, "eager-adasum", [0, 1], "FailedPreconditionError", ["gradient 1", "float32[5]", "float32[6]"])
    check_no_stalls(run)
    check_timeline(text, ["function", "eager", "keras"])
