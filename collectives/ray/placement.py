"""Where the ranks go: a placement group and one actor per rank in it, and the rank order
(grouped by node, so that each node's ranks are consecutive, as MPICH places them)."""
from dataclasses import dataclass
from typing import List, Optional


@dataclass(frozen=True)
class Shape:
    """What was asked: ``num_workers`` (packed) or ``num_hosts`` x ``num_workers_per_host``."""
    num_workers: Optional[int]
    num_hosts: Optional[int]
    num_workers_per_host: Optional[int]
    cpus_per_worker: float
    gpus_per_worker: float  # 0 without use_gpu

    @property
    def size(self):
        return self.num_workers if self.num_workers else self.num_hosts * self.num_workers_per_host

    def worker_resources(self):
        resources = {"CPU": self.cpus_per_worker}
        if self.gpus_per_worker:
            resources["GPU"] = self.gpus_per_worker
        return resources

    def bundles(self):
        """(bundles, strategy, the bundle of each worker)."""
        one = self.worker_resources()
        if self.num_workers:
            return [dict(one) for _ in range(self.num_workers)], "PACK", list(range(self.num_workers))
        per_host = {k: v * self.num_workers_per_host for k, v in one.items()}
        return ([dict(per_host) for _ in range(self.num_hosts)], "STRICT_SPREAD",
                [h for h in range(self.num_hosts) for _ in range(self.num_workers_per_host)])


def check_shape(num_workers, num_hosts, num_workers_per_host, cpus_per_worker, use_gpu, gpus_per_worker):
    """The Shape, or a ValueError naming the argument at fault (as Horovod's checks)."""
    if gpus_per_worker and not use_gpu:
        raise ValueError("gpus_per_worker is set, but use_gpu is False: use_gpu must be True if gpus_per_worker "
                         "is set")
    if use_gpu and gpus_per_worker is not None and gpus_per_worker < 1:
        raise ValueError(f"gpus_per_worker must be >= 1, not {gpus_per_worker!r}")
    if num_workers is not None and (num_hosts is not None or num_workers_per_host is not None):
        raise ValueError("give either num_workers or num_hosts with num_workers_per_host, not both")
    for name, value in (("num_workers", num_workers), ("num_hosts", num_hosts),
                        ("num_workers_per_host", num_workers_per_host)):
        if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 1):
            raise ValueError(f"{name} must be a positive int, not {value!r}")
    if num_workers is None and (num_hosts is None or num_workers_per_host is None):
        raise ValueError("RayExecutor needs num_workers, or num_hosts and num_workers_per_host")
    if not cpus_per_worker or cpus_per_worker < 0:
        raise ValueError(f"cpus_per_worker must be positive, not {cpus_per_worker!r}")
    return Shape(num_workers, num_hosts, num_workers_per_host, cpus_per_worker,
                 (gpus_per_worker or 1) if use_gpu else 0)


def rank_order(infos: List[dict]) -> List[int]:
    """The workers' indices in rank order: grouped by node, nodes in order of first appearance."""
    nodes = list(dict.fromkeys(info["node_id"] for info in infos))
    return [i for node in nodes for i, info in enumerate(infos) if info["node_id"] == node]


def node_groups(infos: List[dict]):
    """[(node_id, node_ip, [indices])] for ``infos`` already in rank order."""
    groups = {}
    for i, info in enumerate(infos):
        groups.setdefault(info["node_id"], (info["node_ip"], []))[1].append(i)
    return [(node, ip, members) for node, (ip, members) in groups.items()]
