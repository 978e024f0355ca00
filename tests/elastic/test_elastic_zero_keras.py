"""Elastic Keras training with a sharded optimizer (``DistributedOptimizer(zero_stage=2)`` in
``hvd.elastic.KerasState``) under ``collectivesrun --min-np/--max-np``: the commits carry every
rank's slices of the state, and a restart, also at another number of ranks, continues from them
(tests/elastic/workers/elastic_driver_keras.py ``--zero-stage``; the driver's own behaviour is
tested in test_elastic_driver.py).

* A rank killed mid-epoch, restart on the same 2 ranks: the final weights equal an uninterrupted
  sharded run's, bitwise (same ranks, same batches, same arithmetic: only each rank's own restored
  momentum slices can make them equal; a restart that gave every rank the slices of the rank
  whose commit file it read would not).
* The size changes: three hosts; the third host's rank is killed in generation 0 and again in
  generation 1, so the driver blacklists it and generation 2 runs on 2 ranks from a commit
  written by 3: the sharded state is redistributed. The same run with the unsharded optimizer
  (whose commits hold whole state) gives the same weights to 1e-6 (three summands add in another
  order in a reducescatter than in an allreduce).

Cost: six launches of TensorFlow ranks (22 processes in all); about 100-200 s on 2 busy cores.
"""
import socket

import pytest

from elastic_job import ElasticJob, discovery_script
from mpi_launch import worker_path
from test_elastic_driver import elastic

pytest.importorskip("tensorflow")

A, B, C = "localhost", "127.0.0.1", socket.gethostname()
KERAS = worker_path("elastic_driver_keras.py")
EPOCHS, STEPS = 2, 6  # the worker's


def final_weights(job, generation, size):
    """Every rank of the last generation ran every epoch's batches once, and holds the same weights."""
    final = [r for r in job.results() if r["generation"] == generation]
    assert sorted(r["rank"] for r in final) == list(range(size)), job.describe()
    for r in final:
        assert (r["epoch"], r["batches"], r["weights"]) == (EPOCHS, [STEPS] * EPOCHS, final[0]["weights"]), \
            job.describe()
    return final[0]["weights"]


def run_on_one_host(tmp_path, zero_stage, die):
    tmp_path.mkdir()
    script, _ = discovery_script(str(tmp_path), [f"{A}:2"])
    kill = ("--die-rank", 1, "--die-step", 8) if die else ()
    job = ElasticJob(["-np", 2] + elastic(script, KERAS, "--zero-stage", zero_stage, "--step-sleep", 0, *kill,
                                          min_np=1, max_np=2, extra=("--elastic-timeout", 10)), timeout=300)
    assert job.finish() == 0, job.describe()
    generation = 1 if die else 0
    restarts = [line for line in job.driver_lines() if "restarting" in line]
    assert len(restarts) == generation, job.describe()
    job.assert_nothing_left()
    return final_weights(job, generation, 2)


def test_sharded_keras_state_survives_a_killed_rank(tmp_path):
    killed = run_on_one_host(tmp_path / "killed", 2, die=True)
    uninterrupted = run_on_one_host(tmp_path / "whole", 2, die=False)
    assert killed == uninterrupted


def run_shrinking(tmp_path, zero_stage):
    tmp_path.mkdir()
    script, _ = discovery_script(str(tmp_path), [f"{A}:1", f"{B}:1", f"{C}:1"])
    job = ElasticJob(elastic(script, KERAS, "--zero-stage", zero_stage, "--step-sleep", 0, "--die-rank", 2,
                             "--die-generation", 0, 1, "--die-step", 3, min_np=2, max_np=3,
                             extra=("--elastic-timeout", 10)), timeout=300)
    assert job.finish() == 0, job.describe()
    assert any("blacklisted" in line for line in job.driver_lines()), job.describe()
    assert any("restarting 2 ranks" in line for line in job.driver_lines()), job.describe()
    job.assert_nothing_left()
    return final_weights(job, 2, 2)


@pytest.mark.skipif(C in (A, B), reason="the hostname must differ from localhost/127.0.0.1")
def test_sharded_keras_state_is_redistributed_when_the_job_shrinks(tmp_path):
    sharded = run_shrinking(tmp_path / "zero", 2)
    unsharded = run_shrinking(tmp_path / "plain", 0)
    assert sharded == pytest.approx(unsharded, abs=1e-6, rel=1e-6)
