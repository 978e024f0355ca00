"""A started set of rank actors with their MPI world: placement group, actors in rank order,
the launcher, and the one teardown that leaves nothing behind. Shared by RayExecutor (one
set for its life) and ElasticRayExecutor (one set per generation)."""
import sys
import time

import cloudpickle

from .actor import RankActor
from .errors import RayStartTimeout
from .placement import Shape, rank_order
from .ray_api import PlacementGroupSchedulingStrategy, placement_group, ray, remove_placement_group
from .world import World

STOP_TIMEOUT_S = 15.0
DEAD_WAIT_S = 30.0


def _get(refs, timeout, what):
    try:
        return ray.get(refs, timeout=timeout)
    except ray.exceptions.GetTimeoutError:
        raise RayStartTimeout(f"{what} did not finish within {timeout:g} s (timeout_s)") from None


class WorkerSet:
    def __init__(self, shape: Shape, settings, env=None, executable=None):
        self.shape = shape
        self.settings = settings
        self.env = dict(env or {})
        self.executable = executable  # (cls, args, kwargs) or None
        self.pg = None
        self.actors = []
        self.infos = []
        self.topology = []
        self.world = None

    def start(self):
        try:
            self._place()
            self._form_world()
        except BaseException:
            self.stop()
            raise
        return self

    def _place(self):
        bundles, strategy, worker_bundle = self.shape.bundles()
        self.pg = placement_group(bundles, strategy=strategy)
        try:
            ray.get(self.pg.ready(), timeout=self.settings.placement_group_timeout_s)
        except ray.exceptions.GetTimeoutError:
            raise RayStartTimeout(
                f"Ray could not place {self.shape.size} workers ({len(bundles)} bundles of {bundles[0]}, {strategy}) "
                f"within {self.settings.placement_group_timeout_s:g} s (placement_group_timeout_s); the cluster "
                f"has {ray.cluster_resources()} in all, {ray.available_resources()} free") from None
        actor_cls = ray.remote(RankActor)
        gpus = self.shape.gpus_per_worker
        actors = [actor_cls.options(num_cpus=self.shape.cpus_per_worker, num_gpus=gpus, max_restarts=0,
                                    scheduling_strategy=PlacementGroupSchedulingStrategy(
                                        self.pg, placement_group_bundle_index=b)).remote()
                  for b in worker_bundle]
        self.actors = actors
        infos = _get([a.info.remote() for a in actors], self.settings.timeout_s, "starting the worker actors")
        order = rank_order(infos)
        self.actors = [actors[i] for i in order]
        self.infos = [infos[i] for i in order]

    def _rank_env(self, rank):
        env = dict(self.env)
        if self.shape.gpus_per_worker:
            # As Horovod on Ray: every rank of a node sees the node's GPUs of this job, and picks its
            # own by local_rank.
            node = self.infos[rank]["node_id"]
            ids = [g for info in self.infos if info["node_id"] == node for g in info["gpu_ids"]]
            env["CUDA_VISIBLE_DEVICES"] = ",".join(dict.fromkeys(ids))
        return env

    def _form_world(self):
        self.world = World(ray.util.get_node_ip_address(), self.settings.timeout_s)
        launches = self.world.launch(self.infos, {})
        _get([self.actors[i].start_proxy.remote(argv, {}) for i, argv in launches], self.settings.timeout_s,
             "starting MPICH's proxies in the actors")
        executable = cloudpickle.dumps(self.executable) if self.executable else None
        setups = [{"env": self._rank_env(r), "sys_path": list(sys.path), "executable": executable}
                  for r in range(len(self.actors))]
        self.topology = _get([a.connect.remote(r, setups[r], self.settings.timeout_s)
                              for r, a in enumerate(self.actors)],
                             self.settings.timeout_s + 10, "forming the MPI world and starting the engine")

    def where(self, rank):
        info = self.infos[rank]
        return f"rank {rank} (Ray actor {info['actor_id'][:12]}, pid {info['pid']}, on node {info['node_ip']})"

    def call(self, kind, fn, args=(), kwargs=None, ranks=None):
        """One ObjectRef per rank (``ranks``: all)."""
        payload = cloudpickle.dumps((fn, tuple(args or ()), dict(kwargs or {})))
        ranks = range(len(self.actors)) if ranks is None else ranks
        return [self.actors[r].call.remote(kind, payload, list(sys.path)) for r in ranks]

    def stop(self):
        """Stops the ranks (engine shut down when they still answer), kills every actor, removes the
        placement group and ends the launcher; waits until Ray reports the actors dead."""
        actors, self.actors = self.actors, []
        if actors:
            try:
                ray.wait([a.stop.remote() for a in actors], num_returns=len(actors), timeout=STOP_TIMEOUT_S)
            except Exception:  # noqa: BLE001 - dead actors cannot stop: they are killed below anyway
                pass
            for a in actors:
                try:
                    ray.kill(a, no_restart=True)
                except Exception:  # noqa: BLE001 - already gone
                    pass
        if self.world is not None:
            self.world.stop()
        if self.pg is not None:
            try:
                remove_placement_group(self.pg)
            except Exception:  # noqa: BLE001 - removed already, or Ray is gone
                pass
            self.pg = None
        return _wait_dead([i["actor_id"] for i in self.infos if i.get("actor_id")])

    def remove_tree(self, path):
        """Removes ``path`` on every node of this set (the elastic commit directory)."""
        leaders = {}
        for actor, info in zip(self.actors, self.infos):
            leaders.setdefault(info["node_id"], actor)
        try:
            ray.wait([a.remove_tree.remote(path) for a in leaders.values()], num_returns=len(leaders), timeout=10)
        except Exception:  # noqa: BLE001 - a node gone takes its directory with it
            pass


def _wait_dead(actor_ids):
    """Until the GCS reports every one of ``actor_ids`` DEAD (ray.kill returns before that);
    returns those still alive after DEAD_WAIT_S (an actor on a node whose loss Ray has not
    noticed yet)."""
    deadline = time.monotonic() + DEAD_WAIT_S
    pending = set(actor_ids)
    while pending and time.monotonic() < deadline:
        try:
            table = ray._private.state.actors()  # noqa: SLF001 - the GCS actor table; needs no dashboard
        except Exception:  # noqa: BLE001 - Ray shut down: nothing left to wait for
            return []
        pending = {a for a in pending if table.get(a, {}).get("State") not in (None, "DEAD")}
        if pending:
            time.sleep(0.2)
    return sorted(pending)
