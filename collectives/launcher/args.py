"""The command line of ``collectivesrun``.

Flags keep horovodrun's spellings where it has them (``-np``/``--num-proc``, ``-H``/``--hosts``,
``-hostfile``/``--hostfile``, ``--fusion-threshold-mb``, ``--cycle-time-ms``,
``--cache-capacity``, ``--timeline-filename``, ``--timeline-mark-cycles``,
``--stall-check-warning-time-seconds``, ``--stall-check-shutdown-time-seconds``,
``--no-stall-check`` (and the hidden opposites ``--no-hierarchical-allreduce``, ``--no-hierarchical-allgather``,
``--no-autotune``, ``--no-timeline-mark-cycles``, ``--stall-check``), ``--log-level``, ``--hierarchical-allreduce``, ``--hierarchical-allgather``,
``--autotune``, ``--autotune-log-file``, ``--autotune-warmup-samples``, ``--autotune-steps-per-sample``,
``--autotune-bayes-opt-max-samples``, ``--autotune-gaussian-process-noise``,
``--mpi-args``, ``-cb``/``--check-build``, ``--verbose``),
so existing job scripts only change the program name; shorter names of our own are accepted
beside them. Everything from the first word that is not an option is the command to run.
"""
import argparse

from .. import config


def parser():
    p = argparse.ArgumentParser(
        prog="collectivesrun",
        allow_abbrev=False,  # a prefix of one flag must not silently mean another
        description="Launch a collectives (Horovod-style) training script on N processes with the MPI "
                    "launcher the engine was built with.",
        epilog="example: collectivesrun -np 4 -H host1:2,host2:2 python train.py --epochs 3")
    p.add_argument("-v", "--version", action="store_true", help="print the collectives version and exit")
    p.add_argument("-np", "--num-proc", dest="np", type=int, metavar="N",
                   help="number of processes (ranks); inside a Slurm allocation, default: its task count")
    p.add_argument("-cb", "--check-build", action="store_true",
                   help="show the MPI, NCCL/CUDA and frameworks this installation can use, then exit")
    p.add_argument("--verbose", action="store_true", help="print the launcher command before running it")

    hosts = p.add_argument_group("hosts").add_mutually_exclusive_group()
    hosts.add_argument("-H", "--hosts", metavar="HOST:SLOTS,...",
                       help="hosts and their slots, e.g. host1:2,host2:2 (default: the Slurm allocation's nodes inside "
                            "sbatch/salloc, else all ranks on this machine)")
    hosts.add_argument("-hostfile", "--hostfile", metavar="FILE",
                       help="file of hosts, one per line: `host slots=N` (horovodrun) or `host:N` (MPICH)")
    p.add_argument("--start-timeout", type=float, default=10.0, metavar="S",
                   help="seconds allowed for resolving and reaching each host (default 10)")

    elastic = p.add_argument_group("elastic (horovodrun's flags; any of the first three makes the job elastic: "
                                   "restarted from its last commit on failures and host changes)")
    elastic.add_argument("--min-np", "--min-num-proc", dest="min_np", type=int, metavar="N",
                         help="fewest ranks to run with (default: -np, else 1)")
    elastic.add_argument("--max-np", "--max-num-proc", dest="max_np", type=int, metavar="N",
                         help="most ranks to run with (default: every usable slot)")
    elastic.add_argument("--host-discovery-script", metavar="SCRIPT",
                         help="executable printing the usable hosts, one `host:slots` (or `host`) per line; "
                              "run about once a second")
    elastic.add_argument("--slots-per-host", "--slots", dest="slots_per_host", type=int, metavar="N",
                         help="slots of a host the discovery script lists without a count (default 1)")
    elastic.add_argument("--reset-limit", type=int, metavar="K", help="most restarts before giving up (default: none)")
    elastic.add_argument("--blacklist-cooldown-range", dest="blacklist_cooldown_range", type=int, nargs=2,
                         metavar=("MIN", "MAX"),
                         help="seconds a failing host stays blacklisted: MIN the first time, doubling each time "
                              "after, at most MAX (default: for the rest of the run)")
    elastic.add_argument("--elastic-timeout", type=float, metavar="S",
                         help="seconds to wait for enough slots (--min-np) before giving up (default 600)")

    knobs = p.add_argument_group("engine settings (forwarded as COLLECTIVES_* variables)")
    knobs.add_argument("--fusion-threshold-mb", type=float, metavar="MB",
                       help="fusion buffer size in MiB (COLLECTIVES_FUSION_THRESHOLD, in bytes; 0 disables fusion)")
    knobs.add_argument("--cycle-time-ms", type=float, metavar="MS", help="COLLECTIVES_CYCLE_TIME")
    knobs.add_argument("--cache-capacity", type=int, metavar="N", help="COLLECTIVES_CACHE_CAPACITY")
    knobs.add_argument("--timeline-filename", metavar="FILE", help="COLLECTIVES_TIMELINE (written by rank 0)")
    _switch(knobs, "timeline-mark-cycles", "COLLECTIVES_TIMELINE_MARK_CYCLES=1")
    knobs.add_argument("--stall-check-time", "--stall-check-warning-time-seconds", dest="stall_check_s",
                       type=float, metavar="S", help="COLLECTIVES_STALL_CHECK_TIME_SECONDS")
    knobs.add_argument("--stall-shutdown-time", "--stall-check-shutdown-time-seconds", dest="stall_shutdown_s",
                       type=float, metavar="S", help="COLLECTIVES_STALL_SHUTDOWN_TIME_SECONDS")
    stall = knobs.add_mutually_exclusive_group()
    stall.add_argument("--no-stall-check", dest="no_stall_check", action="store_const", const=True,
                       help="COLLECTIVES_STALL_CHECK_DISABLE=1")
    stall.add_argument("--stall-check", dest="no_stall_check", action="store_const", const=False,
                       help=argparse.SUPPRESS)  # horovodrun's hidden opposite: COLLECTIVES_STALL_CHECK_DISABLE=0
    knobs.add_argument("--log-level", type=str.lower, choices=config.LOG_LEVELS, help="COLLECTIVES_LOG_LEVEL")
    _switch(knobs, "hierarchical-allreduce",
            "COLLECTIVES_HIERARCHICAL_ALLREDUCE=1: allreduce within each host, across hosts, then within the host "
            "again (--no-hierarchical-allreduce: =0, which also keeps the autotuner from choosing it)")
    _switch(knobs, "hierarchical-allgather",
            "COLLECTIVES_HIERARCHICAL_ALLGATHER=1: gather within each host, across hosts, then broadcast within "
            "the host (--no-hierarchical-allgather: =0)")
    _switch(knobs, "autotune",
            "COLLECTIVES_AUTOTUNE=1: tune the fusion threshold, cycle time and hierarchical algorithms during "
            "the first steps (knobs given explicitly stay fixed)")
    knobs.add_argument("--autotune-log-file", metavar="FILE", help="COLLECTIVES_AUTOTUNE_LOG (CSV, rank 0)")
    knobs.add_argument("--autotune-warmup-samples", type=int, metavar="N", help="COLLECTIVES_AUTOTUNE_WARMUP_SAMPLES")
    knobs.add_argument("--autotune-steps-per-sample", type=int, metavar="N",
                       help="COLLECTIVES_AUTOTUNE_STEPS_PER_SAMPLE")
    knobs.add_argument("--autotune-bayes-opt-max-samples", type=int, metavar="N",
                       help="COLLECTIVES_AUTOTUNE_BAYES_OPT_MAX_SAMPLES (most scored samples)")
    knobs.add_argument("--autotune-gaussian-process-noise", type=float, metavar="X",
                       help="COLLECTIVES_AUTOTUNE_GAUSSIAN_PROCESS_NOISE (accepted; unused by our search)")

    mpi = p.add_argument_group("MPI")
    mpi.add_argument("-x", "--env", action="append", metavar="VAR[=VALUE]",
                     help="set VAR in every rank (VAR alone: pass its current value); repeatable")
    mpi.add_argument("--mpi-args", metavar="'ARGS'", help="extra arguments for mpirun, e.g. --mpi-args='-verbose'")
    # horovodrun's controller choice: MPI is the only one here.
    mpi.add_argument("--mpi", action="store_true", help=argparse.SUPPRESS)
    mpi.add_argument("--gloo", nargs=0, action=_GlooAction, help=argparse.SUPPRESS)
    mpi.add_argument("--disable-cache", action="store_true", help=argparse.SUPPRESS)  # horovodrun's; no cache here

    p.add_argument("command", nargs=argparse.REMAINDER, help="the program and its arguments")
    return p


def _switch(group, name, help_text):
    """horovodrun's on/off pair: ``--NAME`` sets the knob to 1, ``--no-NAME`` to 0 (given explicitly,
    so the autotuner leaves it alone); neither leaves it unset (None)."""
    pair = group.add_mutually_exclusive_group()
    dest = name.replace("-", "_")
    pair.add_argument(f"--{name}", dest=dest, action="store_const", const=True, help=help_text)
    pair.add_argument(f"--no-{name}", dest=dest, action="store_const", const=False, help=argparse.SUPPRESS)


class _GlooAction(argparse.Action):
    def __call__(self, parser, namespace, values, option_string=None):
        parser.error("collectives runs over MPI only; --gloo is not available")


def parse(argv):
    p = parser()
    args = p.parse_args(argv)
    if args.command and args.command[0] == "--":
        args.command = args.command[1:]
    if not (args.version or args.check_build):
        # A missing -np is decided where the hosts are (host_sources.py): inside a Slurm
        # allocation its task count is the default; elsewhere it is an error there.
        if args.np is not None and args.np < 1:
            p.error(f"-np must be at least 1, not {args.np}")
        if not args.command:
            p.error("no command given (e.g. collectivesrun -np 2 python train.py)")
    return args


def is_elastic(args):
    """horovodrun's rule: a discovery script or --min-np/--max-np runs the elastic driver."""
    return bool(args.host_discovery_script) or args.min_np is not None or args.max_np is not None
