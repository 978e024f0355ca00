"""collectivesrun's watch over a running job: the MPI launcher runs as its child, and a job that
the network has broken is ended instead of hanging.

The launcher runs in a session of its own; its stdout is the terminal's, its stderr passes
through unchanged, and SIGINT, SIGTERM and SIGHUP are forwarded to its whole process group, so
Ctrl-C and a batch system's kill work as before. A job that ends by itself exits with its own
status. Two lines on its stderr mean the job cannot finish:

* a rank's watchdog report (csrc/monitor/watchdog.cc): a backend call has not returned after
  COLLECTIVES_STALL_SHUTDOWN_TIME_SECONDS, because a peer stopped, crashed without its kernel
  closing the connections, or lost its link;
* MPICH's ``control_cb (...): assert (!closed) failed``, or ssh's ``Connection to HOST closed by
  remote host.``: the connection to a host's proxy closed, because the host crashed (or its proxy
  or sshd was killed);
* a rank's report of a crash inside the MPI library (csrc/backends/mpi/mpi_fault.h): MPICH
  crashes a surviving rank when a send to a lost peer fails, often before mpiexec reports the
  closed proxy, and mpiexec may then end on that rank alone.

Either way MPICH's mpirun may never exit by itself (it waits on the proxy of a host it can no
longer reach), so collectivesrun ends the job: it probes the remote hosts over ssh to name
those that no longer answer, asks mpirun to stop (SIGTERM: it has the proxies it can reach
kill their ranks), kills mpirun's session after a grace, kills every process left with this
job's id on the hosts that answer (ranks on a host that does not answer end by their own
watchdog), and prints one line saying what happened, naming hosts and ranks.
"""
import ctypes
import os
import re
import shlex
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from typing import Dict, List, Optional, Protocol, Tuple

from . import shm_cleanup

# In every rank's environment: what the sweep recognises the job's processes by.
JOB_ID_VARIABLE = "COLLECTIVESRUN_JOB_ID"
# A rank ended by its watchdog exits with this status (csrc/monitor/watchdog.h kWatchdogExitCode), and so
# does collectivesrun after a stall.
WATCHDOG_EXIT_CODE = 75
# csrc/monitor/watchdog.cc's report as csrc/common/log.cc prints it.
WATCHDOG_REPORT = re.compile(r"\[collectives FATAL rank (\d+)\] stalled in a backend call: (.*?) has not "
                             r"returned after (\S+) s")
# MPICH hydra's mpiexec when the connection to a proxy closes (pmiserv_cb.c).
LOST_PROXY = re.compile(r"control_cb \(.*\): assert \(!closed\) failed")
# OpenSSH's client (the launcher's session to a proxy) when the remote end goes away mid-session: its
# sshd was killed with the host or pod. Seen alone when a surviving rank crashed at the loss first
# and mpiexec ended on that rank's signal without reporting the closed proxy.
LOST_SESSION = re.compile(r"^Connection to \S+ closed by remote host\.")
# srun, run by hydra's -launcher slurm to start the proxies, failing: hydra then waits forever.
SRUN_FAILED = re.compile(r"^srun: (fatal: .*|error: Unable to create step.*|error: .*[Ii]nvalid job id.*)$")
# csrc/backends/mpi/mpi_fault.cc's report of a rank whose MPI library crashed (exit status 76).
MPI_CRASH = re.compile(r"\[collectives FATAL rank (\d+)\] crashed inside the MPI library \((\S+) at (\S+),")

PROBE_TIMEOUT_S = 3.0  # ssh's ConnectTimeout when probing a host after a failure
REPORT_WINDOW_S = 2.5  # after the first report, for the other ranks' (their watchdogs check every second)
STOP_GRACE_S = 3.0  # mpirun's own cleanup after SIGTERM, before its session is killed
SWEEP_TIMEOUT_S = 10.0
FORWARDED_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


@dataclass(frozen=True)
class HostRanks:
    """A host of the job and the ranks placed on it (from collectivesrun's plan)."""
    name: str
    ranks: Tuple[int, ...]
    local: bool  # this machine: no ssh needed
    pod: str = ""  # the Kubernetes pod this host is, in an MPIJob's launcher (operator_hostfile.pod_of)


class Findings:
    """What the launcher's stderr has said so far (fed by the pump thread)."""

    def __init__(self):
        self.lock = threading.Lock()
        self.reports: Dict[int, Tuple[str, str]] = {}  # rank -> (the call, the limit in seconds)
        self.first_report: Optional[float] = None
        self.lost_proxy = False
        self.srun_failed: Optional[str] = None  # srun's line, when it could not start the proxies
        self.crashes: Dict[int, str] = {}  # rank -> "SIGSEGV at libmpi.so.12+0x41e057"
        self.alarm = threading.Event()

    def scan(self, line):
        m = WATCHDOG_REPORT.search(line)
        if m:
            with self.lock:
                self.reports.setdefault(int(m.group(1)), (m.group(2), m.group(3)))
                if self.first_report is None:
                    self.first_report = time.monotonic()
            self.alarm.set()
        elif SRUN_FAILED.search(line.strip()):
            with self.lock:
                self.srun_failed = self.srun_failed or line.strip()
            self.alarm.set()
        elif LOST_PROXY.search(line) or LOST_SESSION.search(line):
            with self.lock:
                self.lost_proxy = True
            self.alarm.set()
        elif MPI_CRASH.search(line):
            m = MPI_CRASH.search(line)
            with self.lock:
                self.crashes.setdefault(int(m.group(1)), f"{m.group(2)} at {m.group(3)}")
            self.alarm.set()


def _write_all(fd, data):
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def pump(src_fd, findings, out_fd=2):
    """Copy the launcher's stderr to ours unchanged, scanning each line."""
    tail = b""
    while True:
        try:
            data = os.read(src_fd, 65536)
        except OSError:
            break
        if not data:
            break
        try:
            _write_all(out_fd, data)
        except OSError:
            pass  # our stderr is gone; keep draining so the launcher never blocks on it
        lines = (tail + data).split(b"\n")
        tail = lines.pop()[-65536:]
        for line in lines:
            findings.scan(line.decode(errors="replace"))
    if tail:
        findings.scan(tail.decode(errors="replace"))


def _death_signal():
    """For the child before exec, on Linux: SIGTERM when collectivesrun dies (even by SIGKILL),
    so that a killed collectivesrun does not leave the job running in its own session. libc is
    loaded here, in the parent: the child only calls it."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    return lambda: prctl(1, int(signal.SIGTERM), 0, 0, 0)  # PR_SET_PDEATHSIG


def _exit_status(code):
    return 128 - code if code < 0 else code  # killed by signal N: 128 + N, as a shell reports it


def run(path, argv, env, hosts: List[HostRanks], reach=None) -> int:
    """Run the launcher and watch it; returns collectivesrun's exit status. OSError when the
    launcher cannot be started. ``reach`` probes and sweeps the remote hosts after a failure
    (default: over ssh)."""
    findings = Findings()
    job_id = env.get(JOB_ID_VARIABLE, "")
    watch = shm_cleanup.SegmentWatch(f"{JOB_ID_VARIABLE}={job_id}") if job_id else None
    try:
        child = subprocess.Popen(argv, executable=path, env=env, stderr=subprocess.PIPE, start_new_session=True,
                                 preexec_fn=_death_signal())
    except OSError:
        if watch:
            watch.clean(0)
        raise
    reader = threading.Thread(target=pump, args=(child.stderr.fileno(), findings), daemon=True)
    reader.start()

    def forward(signum, frame):
        try:
            os.killpg(child.pid, signum)
        except ProcessLookupError:
            pass

    # Signal handlers can only be set from the main thread (main() called from another thread
    # leaves the signals alone).
    main_thread = threading.current_thread() is threading.main_thread()
    previous = {sig: signal.signal(sig, forward) for sig in FORWARDED_SIGNALS} if main_thread else {}
    try:
        code = None
        while code is None and not findings.alarm.wait(0.1):
            code = child.poll()
        if code is not None:
            reader.join(2)  # the launcher's last lines may still be in the pipe
        if not findings.alarm.is_set():
            child.stderr.close()
            return _exit_status(code)
        return end_job(child, reader, findings, hosts, job_id, reach or SSH_REACH)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        if watch:
            watch.clean()  # the segments of ranks killed by a signal (MPICH removes them at a normal exit)


# ----------------------------------------------------------------- ending a broken job

def probe(name, timeout=PROBE_TIMEOUT_S) -> Optional[str]:
    """None when ``name`` answers ssh, else why not (ssh's last line)."""
    cmd = ["ssh", "-o", "BatchMode=yes", "-o", f"ConnectTimeout={max(1, int(timeout))}", name, "true"]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout + 2, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        return f"no answer within {timeout:g} s"
    except OSError as e:
        return f"cannot run ssh: {e.strerror or e}"
    if proc.returncode == 0:
        return None
    lines = [line.strip() for line in proc.stderr.splitlines() if line.strip()]
    reason = lines[-1] if lines else f"ssh exited with {proc.returncode}"
    return reason[len("ssh: "):] if reason.startswith("ssh: ") else reason


def _in_parallel(fn, items):
    results = {}

    def one(item):
        results[item] = fn(item)

    threads = [threading.Thread(target=one, args=(item,), daemon=True) for item in items]
    for t in threads:
        t.start()
    for t in threads:
        t.join(SWEEP_TIMEOUT_S + PROBE_TIMEOUT_S)
    return results


def stop(child):
    """SIGTERM to mpirun (it has the proxies it can reach kill their ranks), then SIGKILL to its
    whole session: mpirun itself if it still waits on a proxy it cannot reach, its local
    proxies, its ssh clients."""
    if child.poll() is None:
        try:
            child.send_signal(signal.SIGTERM)
            child.wait(STOP_GRACE_S)
        except subprocess.TimeoutExpired:
            pass
    try:
        os.killpg(child.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    child.wait()


# A shell snippet run on a remote host: SIGKILL every process of this network namespace whose
# environment holds the job's id (a namespace: on one kernel, as with simulated hosts, /proc
# also lists the other hosts' processes).
SWEEP_SNIPPET = ("me=$(readlink /proc/$$/ns/net); for d in /proc/[0-9]*; do "
                 "[ \"$(readlink $d/ns/net 2>/dev/null)\" = \"$me\" ] || continue; "
                 "tr '\\0' '\\n' < $d/environ 2>/dev/null | grep -qxF {marker} && kill -9 ${{d#/proc/}} 2>/dev/null; "
                 "done; true")


def sweep_local(job_id) -> int:
    """SIGKILL this host's processes that carry the job's id; returns how many."""
    marker = f"{JOB_ID_VARIABLE}={job_id}".encode()
    try:
        mine = os.readlink("/proc/self/ns/net")
        pids = [int(p) for p in os.listdir("/proc") if p.isdigit()]
    except OSError:
        return 0
    killed = 0
    for pid in pids:
        if pid == os.getpid():
            continue
        try:
            if os.readlink(f"/proc/{pid}/ns/net") != mine:
                continue
            with open(f"/proc/{pid}/environ", "rb") as f:
                if marker not in f.read().split(b"\0"):
                    continue
            os.kill(pid, signal.SIGKILL)
            killed += 1
        except OSError:
            continue
    return killed


def sweep_remote(name, job_id):
    command = SWEEP_SNIPPET.format(marker=shlex.quote(f"{JOB_ID_VARIABLE}={job_id}"))
    try:
        subprocess.run(["ssh", "-o", "BatchMode=yes", "-o", f"ConnectTimeout={int(PROBE_TIMEOUT_S)}", name, command],
                       capture_output=True, timeout=SWEEP_TIMEOUT_S, stdin=subprocess.DEVNULL)
    except (subprocess.TimeoutExpired, OSError):
        pass


class SshReach:
    """Probing and sweeping hosts over ssh (hosts given with -H/--hostfile)."""
    what = "ssh"

    @staticmethod
    def probe(name):
        return probe(name)

    @staticmethod
    def sweep(name, job_id):
        sweep_remote(name, job_id)


class Reach(Protocol):
    """How the hosts of a placement are probed and swept after a failure (SshReach here,
    slurm_allocation.SlurmdReach for a Slurm allocation)."""
    what: str  # for the message: "ssh" -> "does not answer ssh"

    def probe(self, name) -> Optional[str]:
        """None when the host answers, else why not."""

    def sweep(self, name, job_id) -> None:
        """Kill what is left of the job on the host."""


SSH_REACH = SshReach()


def end_job(child, reader, findings, hosts: List[HostRanks], job_id, reach=None) -> int:
    reach = reach or SSH_REACH
    remote = [h.name for h in hosts if not h.local]
    silent = {name: why for name, why in _in_parallel(reach.probe, remote).items() if why is not None}
    with findings.lock:
        first = findings.first_report
    if first is not None:
        time.sleep(max(0.0, first + REPORT_WINDOW_S - time.monotonic()))
    stop(child)
    reader.join(2)
    child.stderr.close()
    if job_id:
        answering = [h for h in hosts if h.name not in silent]
        # Always here: what carries the job's id on this machine is the job's (ranks, and the
        # launcher's own helpers: ssh clients, an srun that outlived mpirun).
        sweep_local(job_id)
        _in_parallel(lambda name: reach.sweep(name, job_id), [h.name for h in answering if not h.local])
    with findings.lock:
        stalled = bool(findings.reports)
        line = summary(findings, hosts, silent, reach.what)
    code = WATCHDOG_EXIT_CODE if stalled else (_exit_status(child.returncode) or 1)
    print(f"collectivesrun: error: {line}; the job was ended (exit status {code})", file=sys.stderr, flush=True)
    return code


# ----------------------------------------------------------------- the one line

def rank_list(ranks):
    """'rank 3', 'ranks 0-3', 'ranks 0, 1, 5'"""
    ranks = sorted(ranks)
    parts, i = [], 0
    while i < len(ranks):
        j = i
        while j + 1 < len(ranks) and ranks[j + 1] == ranks[j] + 1:
            j += 1
        parts.append(str(ranks[i]) if i == j else f"{ranks[i]}, {ranks[j]}" if j == i + 1 else f"{ranks[i]}-{ranks[j]}")
        i = j + 1
    return ("rank " if len(ranks) == 1 else "ranks ") + ", ".join(parts)


def host_list(hosts: List[HostRanks]):
    """"host 'b' (rank 2)", "hosts 'b' (rank 2) and 'c' (rank 3)", "host 'j-worker-1.j.ns.svc' (pod
    j-worker-1, ranks 2, 3)"."""
    named = [f"'{h.name}' ({'pod ' + h.pod + ', ' if h.pod else ''}{rank_list(h.ranks)})" for h in hosts]
    text = named[0] if len(named) == 1 else ", ".join(named[:-1]) + " and " + named[-1]
    return ("host " if len(hosts) == 1 else "hosts ") + text


def summary(findings, hosts: List[HostRanks], silent: Dict[str, str], what="ssh") -> str:
    """The one line; ``what`` is how hosts were probed ("ssh", "on its slurmd port")."""
    if findings.srun_failed:
        return f"Slurm could not start the job's step ({findings.srun_failed})"
    gone = [h for h in hosts if h.name in silent]
    why = f" ({silent[gone[0].name]})" if len(gone) == 1 else ""
    on_host = {r: h.name for h in hosts for r in h.ranks}
    if findings.reports:
        reporters = sorted(findings.reports)
        call, limit = findings.reports[reporters[0]]
        line = f"the job stalled: {rank_list(reporters)} waited {limit} s in {call}"
        if gone:
            verb = "does" if len(gone) == 1 else "do"
            return f"{line}; {host_list(gone)} {verb} not answer {what}{why}: the host or its network link is down"
        quiet = [r for r in sorted(on_host) if r not in findings.reports]
        if quiet:
            where = sorted({on_host[r] for r in quiet})
            return (f"{line}; {rank_list(quiet)} (on {', '.join(where)}) did not report it: stopped, hung or cut off "
                    f"(every host answers {what})")
        return f"{line}; every rank reported it and every host answers {what}"
    if len(gone) == 1:
        return (f"lost {host_list(gone)}: the MPI launcher's connection to its proxy closed and the host does not "
                f"answer {what}{why}: it crashed or lost power")
    if gone:
        return (f"lost {host_list(gone)}: the MPI launcher's connections to their proxies closed and they do not "
                f"answer {what}: they crashed or lost power")
    if findings.crashes and not findings.lost_proxy:
        crashed = sorted(findings.crashes)
        return (f"{rank_list(crashed)} crashed inside the MPI library ({findings.crashes[crashed[0]]}) and every host "
                f"answers {what}: a peer's connection failed (a rank killed, or a link that went down)")
    return f"the MPI launcher lost its connection to a host's proxy (the proxy died; every host answers {what})"
