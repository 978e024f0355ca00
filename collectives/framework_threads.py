"""Default sizes of the frameworks' process-wide thread pools, applied at ``init()``.

Every rank on a machine runs its own torch / TensorFlow pools, and each framework sizes them
to all the cores: with several ranks per machine the pools oversubscribe the cores (measured
on this project's 2-core machine: a torch step 14.7 ms with 1 thread per rank, 208 ms with
2 threads per rank at 2 ranks). The default here is cores // ranks on this machine.

A framework is configured only if the user has not: an explicit OMP_NUM_THREADS (torch) or
TF_NUM_INTRAOP_THREADS (TensorFlow) wins. Frameworks are never imported here: one already
imported is configured through its API; one not yet imported through the environment
variables it reads when it starts.
"""
import os
import sys


def threads_per_rank(setting, local_size):
    """The pool size for ``setting`` (the COLLECTIVES_FRAMEWORK_THREADS knob: None for auto,
    0 to leave the frameworks alone, N for N threads)."""
    if setting == 0:
        return None
    if setting is not None:
        return setting
    return max(1, (os.cpu_count() or 1) // max(1, local_size))


def apply(setting, local_size):
    """Set the defaults; returns {framework: threads} for what was configured."""
    n = threads_per_rank(setting, local_size)
    if n is None:
        return {}
    applied = {}
    if "OMP_NUM_THREADS" not in os.environ:
        torch = sys.modules.get("torch")
        if torch is not None:
            torch.set_num_threads(n)
        else:
            os.environ["OMP_NUM_THREADS"] = str(n)  # read by torch (and OpenMP) at start-up
        applied["torch"] = n
    if "TF_NUM_INTRAOP_THREADS" not in os.environ:
        tf = sys.modules.get("tensorflow")
        configured = True
        if tf is not None and hasattr(tf, "config"):
            try:
                tf.config.threading.set_intra_op_parallelism_threads(n)
                tf.config.threading.set_inter_op_parallelism_threads(n)
            except RuntimeError:  # TensorFlow already ran an op: its pools are fixed
                configured = False
        else:
            os.environ["TF_NUM_INTRAOP_THREADS"] = str(n)  # read when TensorFlow starts
            os.environ.setdefault("TF_NUM_INTEROP_THREADS", str(n))
        if configured:
            applied["tensorflow"] = n
    return applied
