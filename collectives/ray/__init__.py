"""Ray: ``RayExecutor`` and ``ElasticRayExecutor`` with Horovod's API; the ranks are Ray actors
and their MPI world is formed without ssh (see docs/ray.md). Needs Ray: pip install 'collectives[ray]'."""
from .ray_api import ray as _ray  # noqa: F401 - first: the clear ImportError without Ray
from .errors import (NotStartedError, RankExited, RayExecutorError, RayStartError, RayStartTimeout,
                     WorkerLostError)
from .executor import RayExecutor
from .elastic import ElasticRayExecutor

__all__ = ["RayExecutor", "ElasticRayExecutor", "RayExecutorError", "RayStartError", "RayStartTimeout",
           "WorkerLostError",
           "NotStartedError", "RankExited"]
