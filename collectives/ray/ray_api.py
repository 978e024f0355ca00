"""The one place that imports Ray: a clear ImportError without it, and Ray's own start-up when
the user has not called ray.init() (Horovod's RayExecutor relies on Ray doing that too)."""
import sys

try:
    import ray
    from ray.util.placement_group import placement_group, remove_placement_group
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy
except ImportError as e:  # pragma: no cover - tested by a subprocess with Ray hidden
    raise ImportError(f"collectives.ray needs Ray, which cannot be imported here ({e}): "
                      "pip install 'collectives[ray]'") from e

__all__ = ["ray", "placement_group", "remove_placement_group", "PlacementGroupSchedulingStrategy", "ensure_initialized"]


def ensure_initialized(who):
    """Starts a local Ray instance when none is connected, saying so in one line."""
    if not ray.is_initialized():
        print(f"collectives.ray: {who}: Ray is not initialised; starting a local Ray instance (ray.init()). To "
              "use a cluster, call ray.init(address='auto') (or ray.init('ray://...')) first", file=sys.stderr,
              flush=True)
        ray.init()
