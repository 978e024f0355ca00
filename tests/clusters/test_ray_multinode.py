"""collectives.ray on a real multi-node Ray cluster: simulated hosts (network namespaces, real
TCP; tests/support/simhosts.py) with ``ray start --head`` on one (no CPUs: it holds no ranks)
and ``ray start --address`` on two others with 2 CPUs each. The user's script
(workers/ray_cluster_driver.py) runs on the head's host.

* RayExecutor(num_hosts=2, num_workers_per_host=2): the ranks spread 2 + 2, with local and cross
  ranks as on two machines, and an allreduce over the links is right;
* ElasticRayExecutor(min 2, max 4) training: a worker node crashed mid-training -> the job goes
  on from the last commit on the 2 workers Ray has alive, and ends with the single-process result.

Needs root (skips otherwise). One cluster serves the module; teardown runs ``ray stop`` in every
namespace and checks that no Ray process of this venv is left. Cost here: about 3 minutes (185 s at load 15).
"""
import json
import os
import select
import shutil
import sys
import time

import numpy as np
import pytest

import simhosts
from ray_support import ray_missing_reason, ray_sessions, remove_new_sessions, wait_until_no_ray_processes

pytestmark = [pytest.mark.skipif(ray_missing_reason() is not None, reason=str(ray_missing_reason())),
              pytest.mark.skipif(simhosts.unavailable_reason() is not None, reason=str(simhosts.unavailable_reason()))]
HERE = os.path.dirname(os.path.abspath(__file__))
DRIVER = os.path.join(HERE, "workers", "ray_cluster_driver.py")
RAY = os.path.join(os.path.dirname(sys.executable), "ray")
PORT = 6379
# The GCS notices a crashed node within a few seconds instead of ~30 s (Ray's defaults).
FAST_FAILURE_DETECTION = {"RAY_health_check_initial_delay_ms": "1000", "RAY_health_check_period_ms": "1000",
                          "RAY_health_check_timeout_ms": "1000", "RAY_health_check_failure_threshold": "3",
                          # Ray 2.60's token authentication: the head writes its own token, which the
                          # nodes started here would have to be given; the hosts are private namespaces.
                          "RAY_AUTH_MODE": "disabled"}


class Cluster:
    def __init__(self, sim):
        self.sim = sim
        self.head = sim.hosts["rayhead"].address

    def env(self, host):
        return dict(FAST_FAILURE_DETECTION, RAY_TEST_NODE_IP=self.sim.hosts[host].address,
                    PYTHONPATH=os.pathsep.join([HERE, os.path.dirname(HERE) + "/support"]))

    def ray(self, host, args, timeout=180):
        run = self.sim.run(host, [RAY, *args], timeout=timeout, env=self.env(host))
        assert run.returncode == 0, f"ray {' '.join(args)} on {host}: {run.stdout}\n{run.stderr}"
        return run

    def driver(self, mode, *extra):
        return self.sim.popen("rayhead", [sys.executable, DRIVER, mode, "--address", f"{self.head}:{PORT}", *extra],
                              env=self.env("rayhead"))


@pytest.fixture(scope="module")
def cluster():
    assert not wait_until_no_ray_processes(5), "Ray processes of this venv were running before the test"
    sessions = ray_sessions()
    with simhosts.SimHosts(["rayhead", "raya", "rayb"]) as sim:
        c = Cluster(sim)
        try:
            c.ray("rayhead", ["start", "--head", f"--node-ip-address={c.head}", f"--port={PORT}", "--num-cpus=0",
                              "--include-dashboard=false", "--disable-usage-stats"])
            for host in ("raya", "rayb"):
                c.ray(host, ["start", f"--address={c.head}:{PORT}", f"--node-ip-address={sim.hosts[host].address}",
                             "--num-cpus=2", "--disable-usage-stats"])
            yield c
        finally:
            for host in sim.hosts:
                sim.run(host, [RAY, "stop", "--force"], timeout=60, env=c.env(host))
            sim.kill_everything()
    left = wait_until_no_ray_processes()
    remove_new_sessions(sessions)
    assert not left, f"Ray processes left after ray stop: {left}"


def _finish(proc, timeout):
    try:
        out, err = proc.communicate(timeout=timeout)
    except Exception:
        proc.kill()
        out, err = proc.communicate()
        raise AssertionError(f"the driver did not finish within {timeout} s\n{out}\n{err[-5000:]}")
    lines = [line for line in out.splitlines() if line.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, f"driver exit {proc.returncode}\n{out}\n{err[-5000:]}"
    return json.loads(lines[-1][len("RESULT "):]), err


def test_ranks_spread_over_two_nodes_with_their_topology(cluster):
    result, _ = _finish(cluster.driver("topology"), 300)
    topology = result["topology"]
    assert [t["rank"] for t in topology] == [0, 1, 2, 3]
    hosts = [t["hostname"] for t in topology]
    assert hosts[0] == hosts[1] != hosts[2] == hosts[3] and set(hosts) == {"raya", "rayb"}, hosts
    assert [(t["local_rank"], t["local_size"], t["cross_rank"], t["cross_size"]) for t in topology] == \
        [(0, 2, 0, 2), (1, 2, 0, 2), (0, 2, 1, 2), (1, 2, 1, 2)]
    for host, total in result["results"]:
        assert total == [10.0, 10.0, 10.0]
    assert [h for h, _ in result["results"]] == hosts


def test_elastic_job_goes_on_from_the_last_commit_when_a_node_crashes(cluster):
    from ray_training import ELASTIC_ROWS, numpy_reference
    steps = 12
    proc = cluster.driver("elastic", "--steps", str(steps), "--announce-commit", "3")
    deadline = time.monotonic() + 240
    seen = ""
    while time.monotonic() < deadline:
        ready, _, _ = select.select([proc.stdout], [], [], 1.0)
        if ready:
            line = proc.stdout.readline()
            seen += line
            if line.startswith("REACHED") or not line:
                break
    assert "REACHED" in seen, f"the elastic job did not reach commit 3: {seen}"
    cluster.sim.crash("rayb")
    result, err = _finish(proc, 300)
    ranks = result["results"]
    w_ref, b_ref = numpy_reference(steps, rows=ELASTIC_ROWS)
    assert [(r[2], r[3]) for r in ranks] == [(0, 2), (1, 2)], ranks
    assert all(r[4] >= 1 and 3 <= r[5] < steps for r in ranks), f"not resumed from a commit: {ranks}\n{err[-3000:]}"
    for r in ranks:
        np.testing.assert_allclose(np.array(r[0]), w_ref, rtol=1e-12, atol=1e-12)
        np.testing.assert_allclose(np.array(r[1]), b_ref, rtol=1e-12, atol=1e-12)
    assert "restarting from commit" in err, err[-3000:]
    print("".join(line + "\n" for line in err.splitlines() if line.startswith("elastic:")))  # what the user saw
