"""The user's side of a Ray job on the simulated cluster (tests/clusters/test_ray_multinode.py):
run on the head's host, it joins the cluster with ray.init(address=...) and prints one
``RESULT {json}`` line.

  topology  RayExecutor(num_hosts=2, num_workers_per_host=2): every rank's topology and host,
            and an allreduce's result
  elastic   ElasticRayExecutor(min_workers=2, max_workers=4) training with a commit per step;
            prints ``REACHED <commit>`` once the job has reached --announce-commit (the test
            then crashes a node), and the ranks' results at the end
"""
import argparse
import json
import os
import sys
import threading
import time

import numpy as np
import ray

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # ray_training
from collectives.ray import ElasticRayExecutor, RayExecutor  # noqa: E402
from ray_training import torch_elastic_train  # noqa: E402


def topology(settings):
    ex = RayExecutor(settings, num_hosts=2, num_workers_per_host=2)
    ex.start()
    try:
        def allreduce():
            import socket
            import collectives as hvd
            return socket.gethostname(), hvd.allreduce(np.full(3, hvd.rank() + 1.0), op=hvd.Sum).tolist()
        results = ex.run(allreduce)
        return {"topology": ex.topology, "results": results}
    finally:
        ex.shutdown()


def elastic(settings, steps, announce):
    ex = ElasticRayExecutor(settings, min_workers=2, max_workers=4)
    ex.start()

    def announcer():
        while ex.server is not None and (ex.server.commit() or 0) < announce:
            time.sleep(0.2)
        print(f"REACHED {announce}", flush=True)
    threading.Thread(target=announcer, daemon=True).start()
    try:
        results = ex.run(torch_elastic_train, args=[steps, 1.0])
    finally:
        ex.shutdown()
    return {"results": [[r[0].tolist(), r[1].tolist(), *r[2:]] for r in results]}


def main():
    p = argparse.ArgumentParser()
    p.add_argument("mode", choices=["topology", "elastic"])
    p.add_argument("--address", required=True)
    p.add_argument("--steps", type=int, default=12)
    p.add_argument("--announce-commit", type=int, default=3)
    a = p.parse_args()
    ray.init(address=a.address, _node_ip_address=os.environ["RAY_TEST_NODE_IP"])
    settings = ElasticRayExecutor.create_settings(timeout_s=120, placement_group_timeout_s=60)
    try:
        out = topology(settings) if a.mode == "topology" else elastic(settings, a.steps, a.announce_commit)
    finally:
        ray.shutdown()
    print("RESULT " + json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
