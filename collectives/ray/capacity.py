"""How many workers the Ray cluster has room for, per alive node (what an elastic job's size
follows): the node's total CPUs (and GPUs) divided by what one worker takes."""
from typing import Dict

from .ray_api import ray


def slots_per_node(cpus_per_worker, gpus_per_worker=0) -> Dict[str, int]:
    """{node address: workers it can hold} for every alive node that can hold one."""
    slots = {}
    for node in ray.nodes():
        if not node.get("Alive"):
            continue
        resources = node.get("Resources", {})
        n = int(resources.get("CPU", 0) // cpus_per_worker)
        if gpus_per_worker:
            n = min(n, int(resources.get("GPU", 0) // gpus_per_worker))
        if n > 0:
            slots[node["NodeManagerAddress"]] = slots.get(node["NodeManagerAddress"], 0) + n
    return slots


def describe(slots: Dict[str, int]) -> str:
    return ", ".join(f"{address}:{n}" for address, n in sorted(slots.items())) or "none"
