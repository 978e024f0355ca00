"""``collectivesrun --min-np N --max-np M [--host-discovery-script S | -H ... | --hostfile F] ...``:
the elastic driver.

MPI cannot grow or shrink a running world, and MPICH's mpirun kills the survivors when a rank
dies, so elasticity here is by restart (as torchrun's agent does it). A *generation* is one
mpirun launch on the hosts usable at that moment (listed, not blacklisted), every slot up to
--max-np; the workers (collectives/elastic) restore the newest commit at its start.

* All ranks exit 0: the job is done, the driver exits 0.
* All ranks exit 77: the host set changed and the job stopped at a commit; the next generation
  starts on the new set (nothing is blamed).
* A rank that exits with another code or by a signal, or whose wrapper vanishes, while its host
  still answers, is a worker failure: the job restarts on the same hosts from the last commit.
  A host that stops answering ssh, or whose ranks failed in two generations in a row, is
  blacklisted (host_health.py; for good, or for a cooldown with --blacklist-cooldown-range) and
  the job restarts on the rest, while at least --min-np slots remain (waiting up to
  --elastic-timeout for them) and --reset-limit allows. When every listed host is
  blacklisted, the driver gives up at once (as Horovod's does).

Every restart counts against --reset-limit, as Horovod counts resets. The driver prints one
``elastic: ...`` line per event on stderr; its exit status is the job's (0, or the failing
rank's status when it gives up, 1 when it cannot start).

The host-set version the workers poll (``hosts_version``) goes up whenever what a generation
launched now would use differs from what the running one was launched with.
"""
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from typing import Optional

from ..elastic.environment import commit_dir_for
from . import command, environment, hosts as hostspec, mpi_locator, reachability
from .host_health import HostHealth, check_cooldown_range
from .elastic_generation import EXIT_HOSTS_UPDATED, Generation, Outcome
from .host_discovery import HostSet, assign, describe, run_script, DiscoveryError
from .notification_server import NotificationServer
from . import shm_cleanup, supervise

DISCOVERY_INTERVAL_S = 1.0  # as Horovod's driver
DEFAULT_ELASTIC_TIMEOUT_S = 600.0  # as horovodrun's --elastic-timeout
WRAPPER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "elastic_rank.py")


def say(message):
    print(f"elastic: {message}", file=sys.stderr, flush=True)


def _rank_status(fate):
    return 128 + fate.value if fate.kind == "signal" else (fate.value or 1)


class Driver:
    def __init__(self, args, environ, launcher, interpreter, cores):
        self.args = args
        self.cores = cores
        self.environ = environ
        self.launcher = launcher
        self.interpreter = interpreter  # cli.interpreter_for, passed in to keep the layers one-way
        self.min_np = args.min_np or args.np or 1
        self.max_np = args.max_np
        self.start_np = args.np or self.min_np
        self.timeout = DEFAULT_ELASTIC_TIMEOUT_S if args.elastic_timeout is None else args.elastic_timeout
        fixed = None
        if args.hosts:
            fixed = hostspec.parse_host_list(args.hosts)
        elif args.hostfile:
            fixed = hostspec.parse_hostfile(args.hostfile)
        elif not args.host_discovery_script:
            fixed = [hostspec.Host(socket.gethostname(), self.max_np or self.start_np)]
        self.hosts = HostSet(args.host_discovery_script, fixed, args.slots_per_host or 1)
        self.health = HostHealth(self.hosts, args.blacklist_cooldown_range)
        self.job_id = uuid.uuid4().hex
        self.commit_dir = commit_dir_for(self.job_id, environ)
        self.server = NotificationServer()
        self.lock = threading.Condition()
        self.version = 0
        self.announced = None  # the assignment the running generation was launched with
        self.finished = threading.Event()
        self.interrupted: Optional[int] = None
        self.generation: Optional[Generation] = None
        self.generation_placement = []  # (host, ranks, local) of the newest generation
        self.resets = 0
        self.used = {}  # host -> local?
        self.status = {}  # host -> reachability.HostStatus

    # ------------------------------------------------------------------ hosts

    def _discover_loop(self):
        warned = None
        while not self.finished.wait(DISCOVERY_INTERVAL_S):
            problem = self.hosts.refresh()
            if problem and problem != warned:
                say(f"warning: {problem}; keeping the last host list")
            warned = problem
            self._release_cooled_down()
            self._compare()

    def _release_cooled_down(self):
        for host in self.hosts.release_expired():
            say(f"host {host}: its blacklist cooldown is over; it is usable again")

    def _compare(self):
        now = assign(self.hosts.usable(), self.max_np)
        with self.lock:
            if self.announced is not None and now != self.announced:
                self.version += 1
                self.announced = now
                self.server.set_version(self.version)
                say(f"hosts changed: {describe(now)} (host set version {self.version}); the job stops at its "
                    "next commit to restart on them")
            self.lock.notify_all()

    def _check_new_hosts(self, names):
        """Resolve new hosts and ssh-check the remote ones; a host that fails is blacklisted."""
        new = [n for n in names if n not in self.status]
        for name in new:
            try:
                self.status.update(reachability.check_hosts([name], self.args.start_timeout))
            except reachability.UnreachableHostError as e:
                self.hosts.ban(name, str(e))
                say(f"host '{name}' left out: {e}")

    def wait_for_slots(self, wanted):
        """The assignment to launch once at least ``wanted`` usable slots exist, or None after
        --elastic-timeout (or when interrupted)."""
        deadline = time.monotonic() + self.timeout
        announced = False
        while True:
            self._release_cooled_down()
            usable = self.hosts.usable()
            self._check_new_hosts([h.name for h in usable])
            usable = self.hosts.usable()
            if sum(h.slots for h in usable) >= wanted:
                return assign(usable, self.max_np)
            if self.interrupted is not None or time.monotonic() >= deadline:
                return None
            if not announced:
                say(f"waiting up to {self.timeout:g} s (--elastic-timeout) for {wanted} slots; usable now: "
                    f"{describe(assign(usable, None))}")
                announced = True
            with self.lock:
                self.lock.wait(min(1.0, max(0.0, deadline - time.monotonic())))

    def _not_enough(self, wanted):
        usable = self.hosts.usable()
        banned = self.hosts.blacklist
        text = (f"only {sum(h.slots for h in usable)} usable slots ({describe(assign(usable, None))}"
                + (f"; blacklisted: {', '.join(sorted(banned))}" if banned else "")
                + f"), fewer than the {wanted} needed, after waiting {self.timeout:g} s (--elastic-timeout)")
        return text

    # ------------------------------------------------------------------ launching

    def _driver_address(self, remote_names):
        """The address ranks reach the driver at: loopback when every host is this machine, else
        this machine's address on the route to the first remote host."""
        if not remote_names:
            return "127.0.0.1"
        status = self.status.get(remote_names[0])
        target = status.addresses[0] if status and status.addresses else remote_names[0]
        try:
            with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
                s.connect((target, 9))  # no packet is sent: this only picks the route
                return s.getsockname()[0]
        except OSError:
            return socket.gethostbyname(socket.gethostname())

    def launch(self, number, assignment) -> Generation:
        host_list = [hostspec.Host(name, n) for name, n in assignment]
        np_ = sum(n for _, n in assignment)
        placement = []
        for h, ranks in zip(host_list, hostspec.ranks_on_hosts(np_, host_list)):
            local = self.status[h.name].local if h.name in self.status else True
            placement.append((h.name, tuple(ranks), local))
            self.used[h.name] = local
        all_local = all(local for _, _, local in placement)
        remote = [name for name, _, local in placement if not local]
        local_ranks = sum(len(r) for _, r, local in placement if local)
        rank_env = environment.build(self.args, self.environ, local_ranks or None, self.cores, self.launcher.flavor)
        variables = dict(rank_env.variables)
        with self.lock:
            version = self.version
            self.announced = assignment
        variables.update({
            "COLLECTIVES_ELASTIC": "1",
            "COLLECTIVES_ELASTIC_DRIVER": f"{self._driver_address(remote)}:{self.server.port}",
            "COLLECTIVES_ELASTIC_JOB_ID": self.job_id,
            "COLLECTIVES_ELASTIC_GENERATION": str(number),
            "COLLECTIVES_ELASTIC_COMMIT_DIR": self.commit_dir,
            "COLLECTIVES_ELASTIC_HOSTS_VERSION": str(version),
            supervise.JOB_ID_VARIABLE: self.job_id,
        })
        program = [sys.executable, WRAPPER, "--", self.interpreter(self.args.command[0])] + self.args.command[1:]
        argv = command.build(self.launcher, np_, host_list, False, variables, self.args.mpi_args, program)
        if all_local and self.launcher.flavor == mpi_locator.HYDRA:
            # Every "host" is this machine: hydra forks one proxy per host name, no ssh.
            argv[1:1] = ["-launcher", "fork"]
        env = dict(self.environ)
        env.update(variables)
        if self.args.verbose:
            say(" ".join(argv))
        return Generation(number, self.launcher.path, argv, env, placement, self.server, self.job_id)

    # ------------------------------------------------------------------ the loop

    def _forward(self, signum, frame):
        self.interrupted = signum
        gen = self.generation
        if gen is not None:
            gen.forward(signum)
        with self.lock:
            self.lock.notify_all()

    def _blame(self, outcome: Outcome):
        """(the hosts with a failed rank, the hosts lost, one text naming what failed, the exit
        status to give up with)."""
        parts, hosts, status = [], [], None
        for r in outcome.culprits:
            fate = outcome.fates[r]
            parts.append(f"rank {r} on {fate.host} {fate.describe()}")
            hosts.append(fate.host)
            status = status or _rank_status(fate)
        for host, why in outcome.silent_hosts.items():
            if host not in hosts:
                parts.append(f"host {host} does not answer ssh ({why})")
        if len(parts) > 3:
            parts = parts[:3] + [f"and {len(parts) - 3} more"]
        return list(dict.fromkeys(hosts)), list(outcome.silent_hosts), "; ".join(parts), status

    def run(self) -> int:
        if self.args.host_discovery_script:
            try:
                listed = run_script(self.args.host_discovery_script, self.hosts.default_slots)
            except DiscoveryError as e:
                say(f"error: {e}")
                return 1
            self.hosts._take(listed)  # noqa: SLF001 - the first, checked discovery
        threading.Thread(target=self._discover_loop, name="elastic-discovery", daemon=True).start()
        main_thread = threading.current_thread() is threading.main_thread()
        previous = ({sig: signal.signal(sig, self._forward) for sig in supervise.FORWARDED_SIGNALS}
                    if main_thread else {})
        try:
            return self._generations()
        finally:
            self.finished.set()
            for sig, handler in previous.items():
                signal.signal(sig, handler)
            self.server.close()
            self._remove_commit_dirs()

    def _generations(self) -> int:
        assignment = self.wait_for_slots(self.start_np)
        if assignment is None:
            if self.interrupted is not None:
                say(f"interrupted by signal {self.interrupted} while waiting for slots")
                return 128 + self.interrupted
            say(f"error: cannot start: {self._not_enough(self.start_np)}")
            return 1
        number = 0
        say(f"starting {sum(n for _, n in assignment)} ranks on {describe(assignment)} (generation 0)")
        while True:
            self.generation = self.launch(number, assignment)
            self.generation_placement = self.generation.placement
            watch = shm_cleanup.SegmentWatch(f"{supervise.JOB_ID_VARIABLE}={self.job_id}")
            try:
                outcome = self.generation.run()
            except OSError as e:
                say(f"error: cannot start {self.launcher.path}: {e.strerror or e}")
                return 1
            finally:
                self.generation = None
                self._remove_segments(watch, number)
            if self.interrupted is not None or outcome.interrupted is not None:
                sig = self.interrupted or outcome.interrupted
                say(f"interrupted by signal {sig}; the job was stopped")
                return 128 + sig
            fates = outcome.fates.values()
            if outcome.launcher_code == 0 and all(f.kind in ("exit", None) and not f.value for f in fates) \
                    and not outcome.culprits:
                say(f"the job finished: {len(outcome.fates)} ranks exited 0 (generation {number}, "
                    f"{self.resets} restarts)")
                return 0
            with self.lock:
                self.announced = None  # nothing runs until the next launch: nothing to announce
            failed_hosts, lost_hosts, reason, status = self._blame(outcome)
            if len(outcome.culprits) == len(outcome.fates) > 1 and \
                    all(f.kind == "exit" for f in outcome.fates.values()):
                # Every rank failing by itself is the program's failure, not the hosts'.
                say(f"{reason}; not restarting: every rank failed by itself, so the program fails wherever it "
                    f"runs (exit status {status})")
                return status
            if failed_hosts or lost_hosts:
                ran_on = [host for host, _, _ in self.generation_placement]
                verdicts = self.health.judge(ran_on, failed_hosts, lost_hosts, reason)
                reason = "; ".join([reason] + [v.text for v in verdicts])
                every, banned = self.health.every_host_blacklisted()
                if every and any(v.blacklisted for v in verdicts):
                    say(f"{reason}; giving up: every host is blacklisted ({', '.join(banned)}) "
                        f"(exit status {status or 1})")
                    return status or 1
            elif any(f.kind == "exit" and f.value == EXIT_HOSTS_UPDATED for f in fates) and \
                    all(f.kind == "exit" and f.value in (0, EXIT_HOSTS_UPDATED) for f in fates):
                reason = f"the ranks stopped at commit {self.server.commit()} for the new host set"
            else:
                if not any(f.hello for f in fates):
                    say(f"error: {self.launcher.path} exited with {outcome.launcher_code} before any rank started")
                    return outcome.launcher_code or 1
                seen = sorted({f.describe() for f in fates})
                reason = (f"the job failed without a culprit (mpirun exited with {outcome.launcher_code}; "
                          f"ranks: {', '.join(seen)})")
                status = outcome.launcher_code or 1
            give_up = status or 1  # a restart for new hosts that cannot happen is a failure too
            if self.args.reset_limit is not None and self.resets >= self.args.reset_limit:
                say(f"{reason}; giving up: the job was already restarted {self.resets} times "
                    f"(--reset-limit {self.args.reset_limit}) (exit status {give_up})")
                return give_up
            assignment = self.wait_for_slots(self.min_np)
            if assignment is None:
                if self.interrupted is not None:
                    say(f"{reason}; interrupted by signal {self.interrupted} while waiting for slots")
                    return 128 + self.interrupted
                say(f"{reason}; giving up: {self._not_enough(self.min_np)} (exit status {give_up})")
                return give_up
            self.resets += 1
            number += 1
            commit = self.server.commit()
            say(f"{reason}; restarting {sum(n for _, n in assignment)} ranks on {describe(assignment)} "
                f"from commit {'none' if commit is None else commit} (generation {number})")

    def _remove_segments(self, watch, number):
        """MPICH's segments of the generation's killed ranks (before the next generation makes its own)."""
        count, size = watch.clean()
        if count and self.args.verbose:
            say(f"removed {shm_cleanup.describe(count, size)} that generation {number}'s ranks left in /dev/shm")

    def _remove_commit_dirs(self):
        """Best effort: the commit directory on every host the job used."""
        for host, local in self.used.items():
            if local:
                shutil.rmtree(self.commit_dir, ignore_errors=True)
            else:
                try:
                    subprocess.run(["ssh", "-o", "BatchMode=yes", "-o", "ConnectTimeout=3", host,
                                    f"rm -rf {self.commit_dir}"], capture_output=True, timeout=10,
                                   stdin=subprocess.DEVNULL)
                except (subprocess.TimeoutExpired, OSError):
                    pass


def check_arguments(args):
    """One line for a bad combination of the elastic flags, or None."""
    if args.min_np is not None and args.min_np < 1:
        return f"--min-np must be at least 1, not {args.min_np}"
    if args.max_np is not None and args.max_np < (args.min_np or 1):
        return f"--max-np {args.max_np} is below --min-np {args.min_np or 1}"
    if args.np is not None and args.min_np is not None and args.np < args.min_np:
        return f"-np {args.np} is below --min-np {args.min_np}"
    if args.np is not None and args.max_np is not None and args.np > args.max_np:
        return f"-np {args.np} is above --max-np {args.max_np}"
    if args.slots_per_host is not None and args.slots_per_host < 1:
        return f"--slots-per-host must be at least 1, not {args.slots_per_host}"
    if args.elastic_timeout is not None and args.elastic_timeout < 0:
        return f"--elastic-timeout must not be negative, not {args.elastic_timeout:g}"
    if args.reset_limit is not None and args.reset_limit < 0:
        return f"--reset-limit must not be negative, not {args.reset_limit}"
    return check_cooldown_range(args.blacklist_cooldown_range)


def main(args, environ, interpreter, cores) -> int:
    """``interpreter`` (cli.interpreter_for) and ``cores`` come from cli.py, which calls this."""
    problem = check_arguments(args)
    if problem:
        print(f"collectivesrun: error: {problem}", file=sys.stderr)
        return 1
    try:
        launcher = mpi_locator.locate(environ)
    except mpi_locator.LauncherError as e:
        print(f"collectivesrun: error: {e}", file=sys.stderr)
        return 1
    try:
        environment.build(args, environ, None, cores, launcher.flavor)  # a bad -x or knob fails here, once
        driver = Driver(args, environ, launcher, interpreter, cores)
    except (hostspec.HostSpecError, environment.RankEnvironmentError) as e:
        print(f"collectivesrun: error: {e}", file=sys.stderr)
        return 1
    return driver.run()
