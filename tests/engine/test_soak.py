"""Soak: 2,000 iterations of mixed random collectives (allreduce in and out of place, batches
of async allreduces, grouped allreduce, broadcast, allgather, alltoall, reducescatter) with
random small shapes and dtypes, reused and fresh names, every result checked; resident memory
may grow by less than MAX_GROWTH_MB between iteration WARMUP and the end.
"""
import re

import pytest

from mpi_launch import run_workers

ITERATIONS = 2000
WARMUP = 200
MAX_GROWTH_MB = 20

CONFIGS = {
    # name: (environment, threads per rank)
    "default": ({}, 1),
    # A tiny response cache (constant eviction and re-negotiation) and a fusion threshold
    # that fuses only some of a batch.
    "small_cache": ({"COLLECTIVES_CACHE_CAPACITY": "16", "COLLECTIVES_FUSION_THRESHOLD": "256"}, 1),
    # No cache (every request negotiated) and no fusion.
    "no_cache_no_fusion": ({"COLLECTIVES_CACHE_CAPACITY": "0", "COLLECTIVES_FUSION_THRESHOLD": "0"}, 1),
    # Three submitting threads per rank: submissions reach the engine in different orders.
    "threads": ({}, 3),
}


@pytest.mark.parametrize("config", list(CONFIGS))
def test_soak_mixed_random_ops(config):
    env, threads = CONFIGS[config]
    run = run_workers(2, "soak_worker.py", ITERATIONS, WARMUP, MAX_GROWTH_MB, 20240611, threads, timeout=300, env=env)
    for rank in range(2):
        assert f"[rank {rank}] 3 passed, 0 failed" in run.stdout, run.describe()
        m = re.search(rf"\[rank {rank}\] RSS after warm-up .* \(\+(-?[\d.]+) MiB\)", run.stdout)
        assert m and float(m.group(1)) < MAX_GROWTH_MB, run.describe()
        m = re.search(rf"\[rank {rank}\] (\d+) iterations", run.stdout)
        assert m and int(m.group(1)) == ITERATIONS * threads, run.describe()
