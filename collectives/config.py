"""The one registry of process-wide knobs, read from the environment at ``init()``.

Each knob is ``COLLECTIVES_<NAME>``; when unset, the matching ``HOROVOD_<NAME>`` is honoured so
existing job scripts keep working. The table of docs/configuration.md is this list.
"""
import math
import os
from dataclasses import dataclass

from .errors import InvalidArgumentError


def _parse_bool(text):
    value = text.strip().lower()
    if value in ("1", "true", "yes", "on"):
        return True
    if value in ("0", "false", "no", "off", ""):
        return False
    raise ValueError(text)


def _non_negative_int(text):
    value = int(text)
    if value < 0:
        raise ValueError(text)
    return value


def _non_negative_float(text):
    value = float(text)
    if not math.isfinite(value) or value < 0:
        raise ValueError(text)
    return value


def _positive_int(text):
    value = int(text)
    if value < 1:
        raise ValueError(text)
    return value


def _threads(text):
    value = text.strip().lower()
    if value == "auto":
        return None
    return _non_negative_int(value)


LOG_LEVELS = ("trace", "debug", "info", "warning", "error", "fatal")


def _parse_log_level(text):
    value = text.strip().lower()
    if value not in LOG_LEVELS:
        raise ValueError(text)
    return value


@dataclass(frozen=True)
class Knob:
    suffix: str  # COLLECTIVES_<suffix>, HOROVOD_<suffix>
    parse: object
    default: object
    doc: str

    @property
    def env(self):
        return "COLLECTIVES_" + self.suffix

    @property
    def horovod_env(self):
        return "HOROVOD_" + self.suffix


KNOBS = {
    "fusion_threshold": Knob("FUSION_THRESHOLD", _non_negative_int, 128 * 1024 * 1024,
                             "Bytes of small allreduces packed into one fusion buffer (0 disables fusion)."),
    "cycle_time_ms": Knob("CYCLE_TIME", _non_negative_float, 1.0,
                          "Milliseconds between negotiation cycles while tensors are pending; "
                          "new work starts a cycle at once."),
    "cache_capacity": Knob("CACHE_CAPACITY", _non_negative_int, 1024,
                           "Entries of the response cache (0 disables it: every request is negotiated)."),
    "timeline_path": Knob("TIMELINE", str, "", "Write a Chrome-trace timeline to this path (rank 0)."),
    "timeline_mark_cycles": Knob("TIMELINE_MARK_CYCLES", _parse_bool, False,
                                 "Mark each negotiation cycle (CYCLE_START) in the timeline."),
    "stall_check_s": Knob("STALL_CHECK_TIME_SECONDS", _non_negative_float, 60.0,
                          "Warn when a tensor was submitted by some ranks but not all for this long."),
    "stall_check_disable": Knob("STALL_CHECK_DISABLE", _parse_bool, False, "Turn the stall warning off."),
    # 30 minutes: torch.distributed's default collective timeout. A stalled job ends with an
    # error instead of waiting forever; 0 restores Horovod's default (never).
    "stall_shutdown_s": Knob("STALL_SHUTDOWN_TIME_SECONDS", _non_negative_float, 1800.0,
                             "Shut the engine down (pending operations fail with StallTimeoutError) after "
                             "a stall this long; 0: never."),
    # 300 s: what torch.distributed's rendezvous store waits for the other ranks by default --
    # long enough for ranks that start late (imports, loading data before init()), short enough
    # that a rank which died before init() does not leave the others waiting for the whole job.
    "init_timeout_s": Knob("INIT_TIMEOUT_SECONDS", _non_negative_float, 300.0,
                           "init() raises StallTimeoutError when not every rank has reached init() within "
                           "this many seconds (collectives then stays stopped in the process); 0: wait "
                           "forever."),
    # 30 minutes, as the stall shutdown: MPICH's MPI_Finalize waits for every rank to finalize,
    # and a rank that never will (its engine thread was left inside MPI) would leave the others
    # waiting at exit if the launcher did not end them. Long, because giving up makes the
    # launcher end the ranks still running (a rank saving a checkpoint while the others exit).
    "finalize_timeout_s": Knob("FINALIZE_TIMEOUT_SECONDS", _non_negative_float, 1800.0,
                               "At exit, a rank waits at most this long in MPI_Finalize for the other ranks "
                               "to finalize, then ends without it (saying so on stderr); 0: wait forever."),
    "framework_threads": Knob("FRAMEWORK_THREADS", _threads, None,
                              "Threads of torch's and TensorFlow's pools per rank: auto (cores / ranks on "
                              "the machine, unless OMP_NUM_THREADS or TF_NUM_INTRAOP_THREADS is set), N, or 0 "
                              "to leave them alone."),
    # 32 MiB: what a training loop's repeated outputs of a few MiB need to be reused every step,
    # while a process that sees many different sizes stays within a small bound.
    "buffer_pool_bytes": Knob("BUFFER_POOL_BYTES", _non_negative_int, 32 * 1024 * 1024,
                              "Bytes of released host buffers (engine-allocated outputs of 128 KiB or more) "
                              "kept for reuse by later outputs of the same size class, which then skip the "
                              "page faults of fresh memory; the least recently released beyond it are "
                              "returned to the system, and shutdown() returns all. 0: keep none."),
    # Horovod's HOROVOD_HIERARCHICAL_ALLREDUCE / _ALLGATHER; csrc/algorithms/hierarchical.h says where they
    # fall back to the flat algorithm.
    "hierarchical_allreduce": Knob("HIERARCHICAL_ALLREDUCE", _parse_bool, False,
                                   "Allreduce host tensors within each host, then across hosts among the ranks of "
                                   "equal local rank (each a shard), then within the host again: 1, true, yes, on "
                                   "or 0, false, no, off."),
    "hierarchical_allgather": Knob("HIERARCHICAL_ALLGATHER", _parse_bool, False,
                                   "Allgather host tensors by gathering within each host, exchanging the hosts' "
                                   "blocks among their first ranks, and broadcasting within the host: 1, true, yes, "
                                   "on or 0, false, no, off."),
    # Horovod's HOROVOD_AUTOTUNE*; csrc/monitor/autotune.h describes the search and the samples.
    "autotune": Knob("AUTOTUNE", _parse_bool, False,
                     "Tune the fusion threshold, the cycle time and (on several hosts with equal ranks per host) "
                     "hierarchical allreduce/allgather during the first steps, then keep the best; knobs set "
                     "explicitly stay fixed: 1, true, yes, on or 0, false, no, off."),
    "autotune_log": Knob("AUTOTUNE_LOG", str, "",
                         "CSV of every autotune sample (Horovod's columns) and, last, the best; written by rank 0."),
    "autotune_warmup_samples": Knob("AUTOTUNE_WARMUP_SAMPLES", _non_negative_int, 3,
                                    "Autotune samples discarded at the start (warm-up)."),
    "autotune_steps_per_sample": Knob("AUTOTUNE_STEPS_PER_SAMPLE", _positive_int, 10,
                                      "Steps (executions of a tensor name) per autotune score; a sample is the "
                                      "median of 5 scores."),
    "autotune_bayes_opt_max_samples": Knob("AUTOTUNE_BAYES_OPT_MAX_SAMPLES", _positive_int, 20,
                                           "Most scored autotune samples; the best so far is kept after them."),
    # Accepted for Horovod's job scripts; our search has no Gaussian process (csrc/monitor/autotune.h).
    "autotune_gaussian_process_noise": Knob("AUTOTUNE_GAUSSIAN_PROCESS_NOISE", _non_negative_float, 0.8,
                                            "Accepted and ignored: the search is coordinate descent, not "
                                            "Bayesian optimisation."),
    # Ours (csrc/algorithms/shm_allreduce.h); the HOROVOD_ twin is read too but Horovod has no such knob.
    "shm_allreduce": Knob("SHM_ALLREDUCE", _parse_bool, True,
                          "When every rank runs on one host, allreduce host tensors of 8 to 512 KiB through "
                          "a segment of shared memory (copy in, each rank reduces its share, copy out) "
                          "instead of MPI: 1, true, yes, on or 0, false, no, off."),
    # Ours (csrc/algorithms/cross_memory_allreduce.h).
    "cma_allreduce": Knob("CMA_ALLREDUCE", _parse_bool, True,
                          "When every rank runs on one host, allreduce host tensors above 512 KiB by "
                          "cross-memory attach (process_vm_readv/writev: any rank on a core reduces chunks "
                          "of every rank's tensor and writes the result into each) instead of MPI: 1, true, "
                          "yes, on or 0, false, no, off."),
    # Ours (csrc/shm/shared_exchange.h).
    "shm_negotiation": Knob("SHM_NEGOTIATION", _parse_bool, True,
                            "When every rank runs on one host, exchange each cycle's negotiation message "
                            "through shared memory instead of an MPI allreduce: 1, true, yes, on or 0, false, "
                            "no, off."),
    # Ours (csrc/core/engine_inline.cc).
    "caller_cycles": Knob("CALLER_CYCLES", _parse_bool, True,
                          "A thread waiting for its own result (a synchronous verb, synchronize()) runs the "
                          "negotiation cycles itself while the engine thread is idle, saving two thread "
                          "hand-offs per operation; host tensors only: 1, true, yes, on or 0, false, no, off."),
    # Ours (csrc/core/engine_wake.cc, HoldForGpuFusion).
    "gpu_fusion_wait": Knob("GPU_FUSION_WAIT", _parse_bool, True,
                            "GPU work submitted while the GPU still runs earlier collectives waits for them "
                            "(at most COLLECTIVES_GPU_FUSION_WAIT_MS) and is fused with what arrives meanwhile: "
                            "1, true, yes, on "
                            "or 0, false, no, off."),
    # 100 ms: on an H200 (two ranks, NCCL over sockets), a ResNet-50 step took 81-89 ms with it,
    # as DDP's 86-90, against 153-199 ms at 1 ms and 86-158 ms at 20 (docs/performance.md, "On a GPU").
    "gpu_fusion_wait_ms": Knob("GPU_FUSION_WAIT_MS", _non_negative_float, 100.0,
                               "The longest GPU work waits for a busy GPU (milliseconds after the oldest of it "
                               "arrived); it starts sooner when the GPU finishes or a fusion threshold's worth "
                               "is waiting."),
    # Ours (csrc/tensorflow/tensorflow_kernels.cc).
    "tensorflow_kernels": Knob("TENSORFLOW_KERNELS", _parse_bool, True,
                               "Inside a tf.function, reduce the gradients of DistributedOptimizer and "
                               "DistributedGradientTape with the engine's own TensorFlow op (registered through "
                               "TensorFlow's C API) instead of a tf.py_function: 1, true, yes, on or 0, false, no, "
                               "off."),
    # Ours (adapters/torch/optimizer.py).
    "overlap_min_bytes": Knob("OVERLAP_MIN_BYTES", _non_negative_int, 1024 * 1024,
                              "torch DistributedOptimizer on host tensors: when the parameters' gradients "
                              "total fewer bytes than this, step() reduces them all in one grouped allreduce "
                              "instead of starting each one during backward (0: always start them during "
                              "backward, as Horovod does)."),
    "log_level": Knob("LOG_LEVEL", _parse_log_level, "warning", "Engine log level: " + ", ".join(LOG_LEVELS) + "."),
    # Read by the engine where they act, once per process (csrc/monitor/latency_stages.h,
    # csrc/gpu/gpu_kernels.cc): init() writes the parsed values back as "1"/"0"
    # (ENGINE_ENVIRONMENT), so those readers see one spelling whatever the user wrote.
    "latency_stages": Knob("LATENCY_STAGES", _parse_bool, False,
                           "Print at shutdown, per rank, where the operations' time went (the hand-off to the "
                           "engine, negotiation, the data call, the hand-off back) and how the negotiation "
                           "travelled: 1, true, yes, on or 0, false, no, off."),
    "gpu_copy_kernel": Knob("GPU_COPY_KERNEL", _parse_bool, True,
                            "Pack and unpack fused GPU buffers with the engine's copy kernel (PTX loaded through "
                            "the CUDA driver); 0: one device-to-device copy per tensor (to compare both paths)."),
    # Read by collectives/gpu_libs.py, which finds the library the engine loads.
    "nccl_library": Knob("NCCL_LIBRARY", str, "",
                         "Path or soname of the NCCL library for GPU tensors; when set it is the only one tried "
                         "(else the nvidia-nccl wheel's, then the system's)."),
    "elastic_commit_base_dir": Knob("ELASTIC_COMMIT_BASE_DIR", str, "",
                                    "Directory in which elastic jobs keep their commit directories "
                                    "(collectives-elastic-<job>, one file per rank) on every host; default /dev/shm "
                                    "(memory), else the temporary directory. Point it at a local disk when the "
                                    "commits do not fit /dev/shm (a container's is often 64 MB)."),
}


def read(key, environ=None):
    """The value of one knob: ours, else Horovod's, else the default."""
    environ = os.environ if environ is None else environ
    knob = KNOBS[key]
    for var in (knob.env, knob.horovod_env):
        text = environ.get(var)
        if text is not None and text != "":
            try:
                return knob.parse(text)
            except ValueError:
                raise InvalidArgumentError(f"{var}={text!r} is not a valid value: {knob.doc}") from None
    return knob.default


def load(environ=None):
    """All knobs as a dict, validated."""
    values = {key: read(key, environ) for key in KNOBS}
    if values["stall_check_disable"]:
        values["stall_check_s"] = 0.0
    return values


# Knobs the engine reads from the environment itself, written back by ``export_engine_environment``.
ENGINE_ENVIRONMENT = ("latency_stages", "gpu_copy_kernel")


def export_engine_environment(values, environ=None):
    """Writes the parsed values of ENGINE_ENVIRONMENT's knobs back as "1"/"0" under our variable
    name (also when they came from Horovod's twin or the default), for the engine's readers."""
    environ = os.environ if environ is None else environ
    for key in ENGINE_ENVIRONMENT:
        environ[KNOBS[key].env] = "1" if values[key] else "0"


# What the autotuner may change; one of these set explicitly in the environment stays fixed.
AUTOTUNED = ("fusion_threshold", "cycle_time_ms", "hierarchical_allreduce", "hierarchical_allgather")


def is_set(key, environ=None):
    """Whether the user gave this knob (ours or Horovod's variable, non-empty)."""
    environ = os.environ if environ is None else environ
    knob = KNOBS[key]
    return any(environ.get(var) not in (None, "") for var in (knob.env, knob.horovod_env))


def engine_config(values, environ=None):
    """The subset the C++ engine takes (``environ``: where ``values`` were read, for the knobs
    autotuning must leave alone)."""
    keys = ("fusion_threshold", "cycle_time_ms", "cache_capacity", "timeline_path", "timeline_mark_cycles",
            "stall_check_s", "stall_shutdown_s", "init_timeout_s", "finalize_timeout_s", "buffer_pool_bytes",
            "hierarchical_allreduce",
            "hierarchical_allgather", "shm_allreduce", "cma_allreduce", "shm_negotiation", "caller_cycles", "gpu_fusion_wait",
            "gpu_fusion_wait_ms", "autotune", "autotune_log", "autotune_warmup_samples",
            "autotune_steps_per_sample", "autotune_bayes_opt_max_samples")
    result = {k: values[k] for k in keys}
    result["autotune_fixed"] = [k for k in AUTOTUNED if is_set(k, environ)]
    return result
