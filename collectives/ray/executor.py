"""``collectives.ray.RayExecutor``: Horovod's RayExecutor API over our engine on MPI.

    executor = RayExecutor(RayExecutor.create_settings(timeout_s=30), num_workers=2)
    executor.start()
    results = executor.run(train_fn)          # one value per rank, in rank order
    executor.shutdown()

Each rank is a Ray actor in a placement group (PACK for num_workers, one bundle per host with
STRICT_SPREAD for num_hosts x num_workers_per_host); the functions run in the rank's process,
where the engine is initialised (``hvd.init()`` in the function is a no-op, as Horovod's
examples call it).
"""
from typing import Any, Callable, Dict, List, Optional

from .errors import NotStartedError, RayExecutorError
from .outcomes import gather, lost_error
from .placement import check_shape
from .ray_api import ensure_initialized
from .settings import create_settings
from .workers import DEAD_WAIT_S, WorkerSet


class RayExecutor:
    create_settings = staticmethod(create_settings)

    def __init__(self, settings, num_workers: Optional[int] = None, num_hosts: Optional[int] = None,
                 num_workers_per_host: Optional[int] = None, cpus_per_worker: float = 1, use_gpu: bool = False,
                 gpus_per_worker: Optional[int] = None):
        self.settings = settings
        self.shape = check_shape(num_workers, num_hosts, num_workers_per_host, cpus_per_worker, use_gpu,
                                 gpus_per_worker)
        self.num_workers = self.shape.size
        self.workers: Optional[WorkerSet] = None

    def start(self, executable_cls: type = None, executable_args: Optional[List] = None,
              executable_kwargs: Optional[Dict] = None, extra_env_vars: Optional[Dict] = None):
        """Places the workers, forms their MPI world and starts the engine in every rank;
        ``executable_cls(*executable_args, **executable_kwargs)`` is then made in each rank (for
        execute()), after ``extra_env_vars`` are set there."""
        ensure_initialized("RayExecutor.start()")
        if self.workers is not None:
            self.shutdown()
        executable = (executable_cls, list(executable_args or []), dict(executable_kwargs or {})) \
            if executable_cls is not None else None
        self.workers = WorkerSet(self.shape, self.settings, extra_env_vars, executable).start()

    @property
    def topology(self) -> List[dict]:
        """Per rank: rank, size, local_rank, local_size, cross_rank, cross_size, hostname, pid."""
        return list(self._started("topology").topology)

    def _started(self, doing):
        if self.workers is None:
            raise NotStartedError(f"RayExecutor.{doing}: the executor is not started (call start() first; after "
                                  "a lost worker or shutdown() it must be started again)")
        return self.workers

    def run_remote(self, fn: Callable, args: Optional[List] = None, kwargs: Optional[Dict] = None) -> List[Any]:
        """``fn(*args, **kwargs)`` on every rank; one ObjectRef per rank (ray.get them)."""
        return self._started("run_remote()").call("run", fn, args, kwargs)

    def run(self, fn: Callable, args: Optional[List] = None, kwargs: Optional[Dict] = None) -> List[Any]:
        """``fn(*args, **kwargs)`` on every rank; the return values in rank order."""
        return self._collect(self.run_remote(fn, args, kwargs), "run()")

    def execute(self, fn: Callable[[Any], Any]) -> List[Any]:
        """``fn(executable)`` on every rank (the executable_cls instance, or None)."""
        return self._collect(self._started("execute()").call("execute", fn), "execute()")

    def execute_single(self, fn: Callable[[Any], Any]) -> Any:
        """``fn(executable)`` on rank 0 only."""
        workers = self._started("execute_single()")
        return self._collect(workers.call("execute", fn, ranks=[0]), "execute_single()")[0]

    def _collect(self, refs, doing):
        workers = self.workers
        values, failure = gather(refs)
        if failure is None:
            return values
        kind, rank, error = failure
        if kind in ("lost", "casualty"):
            lost = lost_error(workers, rank, error, doing)
            self.shutdown()
            raise lost from None
        cause = getattr(error, "cause", None) or error
        raise cause

    def shutdown(self):
        """Stops every rank and kills every actor of this executor; returns when Ray reports them dead."""
        workers, self.workers = self.workers, None
        if workers is not None:
            alive = workers.stop()
            if alive:
                raise RayExecutorError(f"RayExecutor.shutdown(): Ray still reports {len(alive)} of its actors alive "
                                       f"{DEAD_WAIT_S:g} s after they were killed: {', '.join(alive)}")
