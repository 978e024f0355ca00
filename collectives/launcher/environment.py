"""The environment variables every rank receives.

``-x VAR=VALUE`` / ``-x VAR`` from the command line; the engine knobs given as flags, which win
over a ``-x`` of the same variable (written under their names in the config registry, so the
launcher and ``init()`` cannot disagree on a spelling); and defaults for running on one
machine, used only for variables neither the command line nor the launcher's environment sets:

* ``OMP_NUM_THREADS`` = cores // ranks on this machine when unset (PyTorch's and BLAS's
  thread pools follow it), so N ranks do not each start one thread per core.
* When there are more ranks than cores, MPICH's ``MPIR_CVAR_ENABLE_HEAVY_YIELD=1`` (Open MPI:
  ``mpi_yield_when_idle``): a rank waiting inside MPI sleeps between polls instead of
  spinning, which leaves the cores to the ranks that compute. Measured on 2 cores, 4 ranks:
  a waiting rank used 0.03 s of CPU per 0.6 s wait instead of 0.8 s per 1.6 s, and the one
  computing rank finished 2.8x sooner. It costs latency (an 8-byte MPI_Allreduce went from
  20 us to 195 us), so it is only set when oversubscribed. It acts where MPICH yields its
  global lock, i.e. under MPI_THREAD_MULTIPLE, which mpi4py and the engine request.
  MPIR_CVAR_CH4_PROGRESS_THROTTLE and MPIR_CVAR_POLLS_BEFORE_YIELD (ch3 only) were tried and
  change nothing with this MPICH (ch4).
"""
import re
from dataclasses import dataclass, field
from typing import Dict, List

from .. import config
from .mpi_locator import HYDRA, OPEN_MPI

MIB = 1024 * 1024
YIELD_VARIABLES = {HYDRA: ("MPIR_CVAR_ENABLE_HEAVY_YIELD", "1"), OPEN_MPI: ("OMPI_MCA_mpi_yield_when_idle", "1")}
THREAD_VARIABLE = "OMP_NUM_THREADS"
_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


class RankEnvironmentError(ValueError):
    """A bad -x entry or knob value; the message is one line for the user."""


@dataclass
class RankEnvironment:
    variables: Dict[str, str] = field(default_factory=dict)  # set in every rank
    notes: List[str] = field(default_factory=list)  # warnings for the user


def _knob_text(key, value):
    """The knob's text as the ranks will read it, validated here with the registry's own parser
    so a bad value fails once in the launcher instead of in every rank's init()."""
    knob = config.KNOBS[key]
    text = str(value)
    try:
        knob.parse(text)
    except ValueError:
        raise RankEnvironmentError(f"invalid value {text!r} for {knob.env}: {knob.doc}") from None
    return knob.env, text


def knob_variables(args) -> Dict[str, str]:
    """COLLECTIVES_* variables for the knob flags that were given."""
    wanted = []
    if args.fusion_threshold_mb is not None:
        if args.fusion_threshold_mb < 0:
            raise RankEnvironmentError(f"--fusion-threshold-mb must not be negative, not {args.fusion_threshold_mb:g}")
        wanted.append(("fusion_threshold", int(round(args.fusion_threshold_mb * MIB))))
    if args.cycle_time_ms is not None:
        wanted.append(("cycle_time_ms", f"{args.cycle_time_ms:g}"))
    if args.cache_capacity is not None:
        wanted.append(("cache_capacity", args.cache_capacity))
    if args.timeline_filename is not None:
        wanted.append(("timeline_path", args.timeline_filename))
    if args.timeline_mark_cycles is not None:
        wanted.append(("timeline_mark_cycles", "1" if args.timeline_mark_cycles else "0"))
    if args.stall_check_s is not None:
        wanted.append(("stall_check_s", f"{args.stall_check_s:g}"))
    if args.stall_shutdown_s is not None:
        wanted.append(("stall_shutdown_s", f"{args.stall_shutdown_s:g}"))
    if args.no_stall_check is not None:
        wanted.append(("stall_check_disable", "1" if args.no_stall_check else "0"))
    if args.log_level is not None:
        wanted.append(("log_level", args.log_level.lower()))
    # horovodrun's switches: --X gives 1, --no-X gives 0 (explicit, so the autotuner keeps it), neither nothing.
    for key in ("hierarchical_allreduce", "hierarchical_allgather", "autotune"):
        value = getattr(args, key, None)
        if value is not None:
            wanted.append((key, "1" if value else "0"))
    for key, flag in (("autotune_log", "autotune_log_file"), ("autotune_warmup_samples", "autotune_warmup_samples"),
                      ("autotune_steps_per_sample", "autotune_steps_per_sample"),
                      ("autotune_bayes_opt_max_samples", "autotune_bayes_opt_max_samples"),
                      ("autotune_gaussian_process_noise", "autotune_gaussian_process_noise")):
        value = getattr(args, flag, None)
        if value is not None:
            wanted.append((key, f"{value:g}" if isinstance(value, float) else value))
    return dict(_knob_text(key, value) for key, value in wanted)


def explicit_variables(entries, environ) -> RankEnvironment:
    """``-x VAR=VALUE`` sets VAR; ``-x VAR`` passes this shell's current value."""
    result = RankEnvironment()
    for entry in entries or ():
        name, sep, value = entry.partition("=")
        if not _NAME.match(name):
            raise RankEnvironmentError(f"-x {entry}: {name!r} is not a variable name")
        if sep:
            result.variables[name] = value
        elif name in environ:
            result.variables[name] = environ[name]
        else:
            result.notes.append(f"-x {name}: {name} is not set here, so it is not passed")
    return result


def build(args, environ, local_ranks, cores, flavor) -> RankEnvironment:
    """Everything the ranks get. ``local_ranks`` is the number of ranks on this machine, None
    when it cannot be known (remote hosts only)."""
    env = explicit_variables(args.env, environ)
    env.variables.update(knob_variables(args))
    given = set(environ) | set(env.variables)
    if local_ranks:
        if THREAD_VARIABLE not in given:
            env.variables[THREAD_VARIABLE] = str(max(1, cores // local_ranks))
        if local_ranks > cores:
            name, value = YIELD_VARIABLES.get(flavor, (None, None))
            yielding = ""
            if name and name not in given:
                env.variables[name] = value
                yielding = f"; waiting ranks yield the CPU ({name}={value})"
            env.notes.append(f"{local_ranks} ranks on {cores} cores of this machine (oversubscribed): "
                             f"expect slower steps{yielding}")
    return env
