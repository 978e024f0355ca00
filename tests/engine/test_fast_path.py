"""The small-allreduce fast path: a cached small host allreduce carried by the cycle's
negotiation (csrc/negotiation/fused_negotiation.h), whose message travels through shared memory on one host
(csrc/shm/shared_exchange.h) or as an MPI allreduce whose payload capacity follows the sizes in use
(COLLECTIVES_SHM_NEGOTIATION=0, as between hosts), and the Python shortcuts for the common call
(engine.allreduce_now for the synchronous verbs, the common-call branch of collectives/requests.py for the others).
One mpirun launch of tests/engine/workers/fast_path_worker.py per size and transport:
results against numpy references for every eligible dtype and op below, at and above the
payload limit, with scale factors, in place, async and non-contiguous; a rank that is late
(the carried data is discarded and the allreduce completes in a later cycle); ranks carrying
different entries; a cached name resubmitted with another shape on one rank (every rank gets
the mismatch error).

The engine reports at shutdown (COLLECTIVES_LATENCY_STAGES=1) how many allreduces the
negotiation carried and how many carried payloads it discarded: both must be nonzero on every
rank, or the cases above did not exercise the path they are about.
"""
import re

import pytest

from mpi_launch import assert_all_ranks_passed, run_workers

REPORT = re.compile(r"\[collectives latency stages rank (\d+)\].*fused with the negotiation: (\d+) done, (\d+) "
                    r"discarded;.* negotiation through ([\w ]+), payload capacity changed (\d+) times")


@pytest.mark.parametrize("np_,shared", [(2, True), (3, True), (2, False)])
def test_fast_path(np_, shared):
    env = {"COLLECTIVES_LATENCY_STAGES": "1", "COLLECTIVES_SHM_NEGOTIATION": "1" if shared else "0"}
    run = run_workers(np_, "fast_path_worker.py", timeout=240, env=env)
    assert_all_ranks_passed(run, np_, min_cases=5)
    reports = {int(r): (int(done), int(discarded), how, int(resizes))
               for r, done, discarded, how, resizes in REPORT.findall(run.stderr)}
    assert sorted(reports) == list(range(np_)), f"engine reports from ranks {sorted(reports)}:\n{run.describe()}"
    for rank, (done, discarded, how, resizes) in reports.items():
        assert how == ("shared memory" if shared else "MPI"), f"rank {rank}: negotiation through {how}"
        # Case 1 alone carries two of every three calls of 9 dtypes (float16 and bfloat16 among
        # them) x 5 ops x 3 sizes; over MPI the first cached call of a size above this cycle's
        # capacity runs on the ordinary path instead (one of the two, for the largest size), while
        # the capacity grows.
        least = 9 * 5 * 3 * 2 if shared else 9 * 5 * 2 * 2 + 9 * 5
        assert done >= least, f"rank {rank}: only {done} allreduces carried\n{run.describe()}"
        assert discarded >= 1, f"rank {rank}: no carried payload was ever discarded\n{run.describe()}"
        if not shared:  # grown for the 4 KiB payloads and shrunk again in the quieter cases
            assert resizes >= 2, f"rank {rank}: the payload capacity changed {resizes} times\n{run.describe()}"


def test_allreduce_now():
    """The synchronous verbs' one engine call (csrc/python/allreduce_now.cc): what it declines and leaves
    to the general path (nothing submitted, the name then works there), results against numpy,
    an engine-pool output, errors on every rank (tests/engine/workers/allreduce_now_worker.py)."""
    for np_ in (2, 3):
        run = run_workers(np_, "allreduce_now_worker.py", timeout=120)
        assert_all_ranks_passed(run, np_, min_cases=7)
