"""What the autotuner (COLLECTIVES_AUTOTUNE, Horovod's HOROVOD_AUTOTUNE) has in force.

Horovod offers no Python call for this; ours is for tests, benchmarks and logs:
``collectives.autotune.state()``. The search itself runs in the engine (csrc/monitor/autotune.h).
"""
from . import basics


def state():
    """A dict: ``enabled``, ``tuning`` (still searching; False once the best is fixed),
    the parameters in force (``fusion_threshold`` in bytes, ``cycle_time_ms``,
    ``hierarchical_allreduce``, ``hierarchical_allgather``; identical on every rank), ``samples``
    (scored so far) and ``best_score`` (bytes per microsecond, as rank 0 measured it)."""
    return basics.engine().autotune_state()
