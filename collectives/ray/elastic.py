"""``collectives.ray.ElasticRayExecutor``: an elastic job whose size follows the workers Ray
has room for, between min_workers and max_workers.

As collectivesrun's elastic driver (collectives/launcher/elastic_driver.py), elasticity is by
restart, because an MPI world cannot change its size: a *generation* is one set of rank actors
with their MPI world, on the slots the alive Ray nodes have; the user's function uses
``hvd.elastic.run`` (collectives/elastic) and each generation restores the newest commit any
rank holds. The same elastic contract is used (COLLECTIVES_ELASTIC_* in the ranks' environment,
the driver's notification server for the host-set version):

* every rank returns: the job is done; run() returns the last generation's values;
* every rank exits 77 (the cluster changed and the job stopped at a commit): the next
  generation starts on the new slots, nothing blamed;
* a worker lost (its actor or node died) or a rank ended by a failed collective (78): the next
  generation starts from the last commit on the workers Ray has alive, while at least
  min_workers fit (waiting up to elastic_timeout for them) and reset_limit allows;
* an exception of the function itself is raised (it would fail wherever it ran).
"""
import sys
import threading
import time
import uuid
from typing import Callable, Optional

from ..elastic.environment import commit_dir_for
from ..launcher.notification_server import NotificationServer
from . import capacity
from .errors import RayExecutorError, RayStartTimeout
from .outcomes import gather
from .placement import Shape, check_shape
from .ray_api import ensure_initialized, ray
from .settings import create_settings
from .workers import WorkerSet

EXIT_HOSTS_UPDATED = 77
DISCOVERY_INTERVAL_S = 1.0


def say(message):
    print(f"elastic: {message}", file=sys.stderr, flush=True)




def create_elastic_settings(min_np=1, max_np=None, reset_limit=None, elastic_timeout=600, timeout_s=60,
                            placement_group_timeout_s=100, **kwargs):
    """Horovod's ElasticRayExecutor.create_settings (min_np/max_np are defaults for the
    constructor's min_workers/max_workers)."""
    base = create_settings(timeout_s=timeout_s, placement_group_timeout_s=placement_group_timeout_s, **kwargs)
    base.min_np, base.max_np, base.reset_limit, base.elastic_timeout = min_np, max_np, reset_limit, elastic_timeout
    return base


class ElasticRayExecutor:
    create_settings = staticmethod(create_elastic_settings)

    def __init__(self, settings, min_workers: Optional[int] = None, max_workers: Optional[int] = None,
                 cpus_per_worker: float = 1, use_gpu: bool = False, gpus_per_worker: Optional[int] = None,
                 env_vars: Optional[dict] = None, reset_limit: Optional[int] = None, elastic_timeout: float = None,
                 cpus_per_slot: Optional[float] = None, gpus_per_slot: Optional[int] = None, **_ignored):
        self.settings = settings
        self.min_workers = min_workers or getattr(settings, "min_np", None) or 1
        self.max_workers = max_workers or getattr(settings, "max_np", None)
        if self.max_workers is not None and self.max_workers < self.min_workers:
            raise ValueError(f"max_workers ({self.max_workers}) is below min_workers ({self.min_workers})")
        shape = check_shape(self.min_workers, None, None, cpus_per_slot or cpus_per_worker, use_gpu,
                            gpus_per_slot or gpus_per_worker)
        self.cpus_per_worker, self.gpus_per_worker = shape.cpus_per_worker, shape.gpus_per_worker
        self.use_gpu = use_gpu
        self.env_vars = dict(env_vars or {})
        self.reset_limit = reset_limit if reset_limit is not None else getattr(settings, "reset_limit", None)
        self.elastic_timeout = elastic_timeout if elastic_timeout is not None else \
            getattr(settings, "elastic_timeout", 600)
        self.job_id = uuid.uuid4().hex
        self.commit_dir = commit_dir_for(self.job_id)
        self.server = None
        self.resets = 0
        self.generation_slots = None  # what the running generation was started on
        self.version = 0
        self.finished = threading.Event()
        self.lock = threading.Lock()

    def start(self):
        ensure_initialized("ElasticRayExecutor.start()")
        self.server = NotificationServer()

    # ------------------------------------------------------------ the cluster

    def _slots(self):
        return capacity.slots_per_node(self.cpus_per_worker, self.gpus_per_worker)

    def _size(self, slots):
        total = sum(slots.values())
        return min(total, self.max_workers) if self.max_workers else total

    def _watch(self):
        """Raises the host-set version when the cluster's slots differ from the generation's."""
        while not self.finished.wait(DISCOVERY_INTERVAL_S):
            try:
                now = self._slots()
            except Exception:  # noqa: BLE001 - Ray going down: the run loop will say so
                continue
            with self.lock:
                if self.generation_slots is not None and now != self.generation_slots and \
                        self._size(now) >= self.min_workers:
                    self.version += 1
                    self.generation_slots = now
                    self.server.set_version(self.version)
                    say(f"the cluster changed: {capacity.describe(now)} (host set version {self.version}); the job "
                        "stops at its next commit to restart on it")

    def _wait_for_workers(self):
        deadline = time.monotonic() + self.elastic_timeout
        announced = False
        while True:
            slots = self._slots()
            if self._size(slots) >= self.min_workers:
                return slots
            if time.monotonic() >= deadline:
                raise RayExecutorError(f"ElasticRayExecutor: only {self._size(slots)} workers fit in the cluster "
                                       f"({capacity.describe(slots)}), fewer than min_workers={self.min_workers}, "
                                       f"after waiting {self.elastic_timeout:g} s (elastic_timeout)")
            if not announced:
                say(f"waiting up to {self.elastic_timeout:g} s (elastic_timeout) for {self.min_workers} workers; the "
                    f"cluster has room for {self._size(slots)} ({capacity.describe(slots)})")
                announced = True
            time.sleep(DISCOVERY_INTERVAL_S)

    # ------------------------------------------------------------ the generations

    def _environment(self, generation, driver_ip):
        env = dict(self.env_vars)
        env.update({"COLLECTIVES_ELASTIC": "1", "COLLECTIVES_ELASTIC_DRIVER": f"{driver_ip}:{self.server.port}",
                    "COLLECTIVES_ELASTIC_JOB_ID": self.job_id, "COLLECTIVES_ELASTIC_GENERATION": str(generation),
                    "COLLECTIVES_ELASTIC_COMMIT_DIR": self.commit_dir,
                    "COLLECTIVES_ELASTIC_HOSTS_VERSION": str(self.version)})
        return env

    def _start_generation(self, number):
        slots = self._wait_for_workers()
        size = self._size(slots)
        with self.lock:
            self.generation_slots = slots
        shape = Shape(size, None, None, self.cpus_per_worker, self.gpus_per_worker)
        say(f"generation {number}: {size} workers on {capacity.describe(slots)}")
        workers = WorkerSet(shape, self.settings, self._environment(number, ray.util.get_node_ip_address()))
        return workers.start()

    def run(self, worker_fn: Callable, args=None, kwargs=None, callbacks=None):
        """Runs ``worker_fn(*args, **kwargs)`` (which uses hvd.elastic.run) on every rank of each
        generation until one finishes; returns that generation's values in rank order."""
        if self.server is None:
            raise RayExecutorError("ElasticRayExecutor.run(): call start() first")
        del callbacks  # Horovod's are for its Ray Tune reporting; nothing to report to here
        self.finished = threading.Event()
        threading.Thread(target=self._watch, name="collectives-ray-elastic", daemon=True).start()
        number, failing_since = 0, None
        try:
            while True:
                try:
                    workers = self._start_generation(number)
                    failing_since = None
                except RayStartTimeout as e:
                    # The cluster changed under the placement (a node lost before Ray noticed):
                    # a fresh look at it, as a reset, for up to elastic_timeout.
                    failing_since = failing_since or time.monotonic()
                    if time.monotonic() - failing_since > self.elastic_timeout:
                        raise RayExecutorError(
                            f"ElasticRayExecutor: no generation could start for {self.elastic_timeout:g} s "
                            f"(elastic_timeout); the last try: {e}") from None
                    self._count_reset(f"generation {number} could not start: {e}")
                    number += 1
                    continue
                try:
                    values, failure = gather(workers.call("run", worker_fn, args, kwargs))
                    if failure is None:
                        say(f"the job finished on {len(values)} workers (generation {number}, {self.resets} "
                            "restarts)")
                        workers.remove_tree(self.commit_dir)
                        return values
                    self._judge(failure, workers, number)
                except BaseException:
                    workers.remove_tree(self.commit_dir)  # the job ends here: its commits go too
                    raise
                finally:
                    workers.stop()
                number += 1
        finally:
            self.finished.set()

    def _judge(self, failure, workers, number):
        kind, rank, error = failure
        cause = getattr(error, "cause", None) or error
        if kind == "error":
            raise cause
        if kind == "exit" and getattr(cause, "code", None) == EXIT_HOSTS_UPDATED:
            say(f"generation {number} stopped at commit {self.server.commit()} for the new cluster")
            return
        what = workers.where(rank)
        reason = {"lost": f"worker {what} was lost", "casualty": f"the process of {what} ended",
                  "exit": f"{what} exited ({cause})"}[kind]
        self._count_reset(f"{reason}; restarting from commit {self.server.commit()} on the workers Ray has alive")

    def _count_reset(self, text):
        self.resets += 1
        if self.reset_limit is not None and self.resets > self.reset_limit:
            raise RayExecutorError(f"ElasticRayExecutor: {text.split(';')[0]}; not restarting: reset_limit "
                                   f"{self.reset_limit} reached")
        say(text)

    def shutdown(self):
        self.finished.set()
        if self.server is not None:
            self.server.close()
            self.server = None
