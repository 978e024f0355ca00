"""Collectives over more than 2**31 elements / bytes (MPI large counts or chunking).

One 2 GiB buffer per rank (np=2, about 4 GiB plus MPI's temporaries in all): allreduce_ Sum of
uint8 and int8 with markers straddling the 2**31 boundary, then a broadcast_ of 2**31 + 5
bytes, each checked in full (chunked min/max) and at the boundary positions.
"""
from mpi_launch import run_workers

# Minutes of wall clock on a loaded 2-core machine: generous, but finite.
LARGE_TIMEOUT_S = 600


def test_allreduce_and_broadcast_over_2_pow_31_elements():
    run = run_workers(2, "large_worker.py", timeout=LARGE_TIMEOUT_S)
    for rank in range(2):
        assert f"[rank {rank}] 3 passed, 0 failed" in run.stdout, run.describe()
