"""Correctness of the collective verbs against numpy references, on 2, 3 and 4 real MPI ranks.

Each test is one mpirun launch of ``tests/engine/workers/ops_worker.py`` running a list of case
families (see that file); every rank checks its own results and exits non-zero on any
failure, which fails the test with the workers' full output.

Families: allreduce (every dtype x Sum/Average/Min/Max/Product x prescale/postscale, in place,
async, bool rejection), shapes (odd sizes, zero-size and 0-d tensors for every op),
noncontig (strided/transposed/Fortran/negative-stride inputs for every op, in place too),
broadcast, allgather, alltoall, reducescatter, grouped, types (array.array / bytearray /
bytes / memoryview in and out, handles), objects (broadcast_object, allgather_object,
barrier), stress (hundreds of async ops before any synchronize, every op outstanding at
once, names reused over iterations with changing shapes/splits/roots/dtypes, ranks
submitting in different orders and at different speeds).
"""

import pytest

from mpi_launch import assert_all_ranks_passed, run_workers

ALL_FAMILIES = ["allreduce", "shapes", "noncontig", "broadcast", "allgather", "alltoall", "reducescatter", "grouped",
                "types", "objects", "stress"]
TIMEOUT = 240  # seconds per launch; a run takes ~2-20 s on an idle 2-core machine


@pytest.mark.parametrize("np_", [2, 3, 4])
def test_ops_default_config(np_):
    """Every family with the default fusion threshold (128 MiB) and response cache (1024 entries)."""
    run = run_workers(np_, "ops_worker.py", *ALL_FAMILIES, timeout=TIMEOUT)
    assert_all_ranks_passed(run, np_)


@pytest.mark.parametrize("np_", [2, 3, 4])
def test_ops_small_fusion_buffer_without_cache(np_):
    """A 4 KiB fusion buffer (many fused batches, some tensors larger than the buffer) and the
    response cache disabled, so every request goes through the coordinator."""
    env = {"COLLECTIVES_FUSION_THRESHOLD": "4096", "COLLECTIVES_CACHE_CAPACITY": "0"}
    run = run_workers(np_, "ops_worker.py", "stress", "grouped", "allreduce", "reducescatter", timeout=TIMEOUT,
                      env=env)
    assert_all_ranks_passed(run, np_)


def test_ops_tiny_cache_without_fusion():
    """A 4-entry response cache (constant eviction, groups larger than the cache) and fusion off."""
    env = {"COLLECTIVES_CACHE_CAPACITY": "4", "COLLECTIVES_FUSION_THRESHOLD": "0"}
    run = run_workers(3, "ops_worker.py", "stress", "grouped", timeout=TIMEOUT, env=env)
    assert_all_ranks_passed(run, 3)
