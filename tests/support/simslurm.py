"""A real Slurm cluster on simulated hosts (tests/support/simhosts.py): Debian's ``slurmctld`` in
the first host, one ``slurmd`` per host (each under its own NodeName, spool, pid and log files), and
one ``munged`` they all authenticate through (its socket is a path, which every namespace reaches).

    with SimHosts(["nodea", "nodeb"]) as sim, SimSlurm(sim) as slurm:
        run = slurm.run("nodea", ["sbatch", "--wait", "-N", "2", "-n", "3", "job.sh"], timeout=120)
        slurm.squeue()        # the jobs still known to the controller as pending/running/completing

Everything lives in one temporary directory (slurm.conf, the munge key and socket, state, spool
and logs), the daemons run in the foreground as this process's children, and teardown (context
manager, atexit, SIGTERM/SIGHUP) cancels every job, stops the daemons and removes the directory
whatever happened; a run killed with SIGKILL is cleaned up by the next one (``remove_leftovers``).
Nothing outside that directory is touched: the packages' own /etc/slurm and /etc/munge are not read.

``ensure_installed()`` installs ``slurm-wlm`` and ``munge`` with apt-get when they are missing and
the machine allows it (CI runs as root), else says why not (for pytest.skip).
"""
import atexit
import os
import shutil
import signal
import subprocess
import tempfile
import time
from typing import Dict, List, Optional

import simhosts

DAEMONS = ("slurmctld", "slurmd", "munged")
CLIENTS = ("sbatch", "srun", "squeue", "scancel", "scontrol", "sinfo")
PACKAGES = ("slurm-wlm", "munge")
APT_TIMEOUT_S = 900
START_TIMEOUT_S = 60
STOP_TIMEOUT_S = 15
# Short enough that a crashed host is declared DOWN (and its jobs' leftovers purged) within a test,
# long enough for a slurmd on a loaded 2-core machine to answer pings.
SLURMD_TIMEOUT_S = 10
# In the host's own mount namespace (made by `ip netns exec`): gone with the slurmd.
CGROUP_MOUNT = "mount -t tmpfs simslurm-cgroup /sys/fs/cgroup"


def _missing() -> List[str]:
    return [tool for tool in DAEMONS + CLIENTS if shutil.which(tool) is None]


def ensure_installed() -> Optional[str]:
    """None once slurmctld, slurmd, munged and the clients are on PATH (installing Debian's
    packages with apt-get when missing), else why not."""
    if not _missing():
        return None
    if shutil.which("apt-get") is None:
        return f"Slurm is not installed ({', '.join(_missing())} missing) and there is no apt-get to install it"
    if os.geteuid() != 0:
        return f"Slurm is not installed ({', '.join(_missing())} missing) and installing it needs root"
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    for argv in (["apt-get", "install", "-y", "--no-install-recommends", *PACKAGES],
                 ["apt-get", "update"], ["apt-get", "install", "-y", "--no-install-recommends", *PACKAGES]):
        try:
            proc = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=APT_TIMEOUT_S,
                                  stdin=subprocess.DEVNULL)
        except subprocess.TimeoutExpired:
            return f"`{' '.join(argv)}` did not finish within {APT_TIMEOUT_S} s"
        if proc.returncode == 0 and not _missing():
            return None
    last = (proc.stderr.strip().splitlines() or ["?"])[-1]
    return f"cannot install {' '.join(PACKAGES)} with apt-get: {last}"


def _children(pid) -> List[int]:
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            return [int(p) for p in f.read().split()]
    except OSError:
        return []


class SimSlurmError(RuntimeError):
    pass


_live: List["SimSlurm"] = []
_guard_installed = False
DIR_PREFIX = "simslurm-"


def _teardown_all():
    for slurm in list(_live):
        slurm.teardown()


def _install_guard():
    """Teardown at exit and on SIGTERM/SIGHUP, before the handler that was there (simhosts',
    which removes the namespaces and re-raises the signal)."""
    global _guard_installed
    if _guard_installed:
        return
    atexit.register(_teardown_all)
    for sig in (signal.SIGTERM, signal.SIGHUP):
        previous = signal.getsignal(sig)

        def handler(signum, frame, previous=previous):
            _teardown_all()
            if callable(previous):
                previous(signum, frame)
            else:
                signal.signal(signum, signal.SIG_DFL)
                os.kill(os.getpid(), signum)
        signal.signal(sig, handler)
    _guard_installed = True


def remove_leftovers():
    """What a run killed with SIGKILL left: its directory and its munged (the daemons in the
    namespaces go with simhosts' own leftovers). Directories are named simslurm-<owner pid>-*."""
    tmp = tempfile.gettempdir()
    for entry in os.listdir(tmp):
        if not entry.startswith(DIR_PREFIX):
            continue
        owner = entry[len(DIR_PREFIX):].split("-")[0]
        if not owner.isdigit() or simhosts._alive(int(owner)):  # noqa: SLF001 - the same liveness rule
            continue
        path = os.path.join(tmp, entry)
        try:
            with open(os.path.join(path, "munged.pid")) as f:
                pid = int(f.read().strip())
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmdline = f.read()
            if b"munged" in cmdline and path.encode() in cmdline:  # not a reused pid
                os.kill(pid, signal.SIGKILL)
        except (OSError, ValueError):
            pass
        shutil.rmtree(path, ignore_errors=True)


class SimSlurm:
    """slurmctld on the first simulated host, a slurmd on every one; a context manager."""

    def __init__(self, sim: simhosts.SimHosts, cpus_per_node=2):
        self.sim = sim
        self.hosts = list(sim.hosts)
        self.controller = self.hosts[0]
        remove_leftovers()
        _install_guard()
        self.dir = tempfile.mkdtemp(prefix=f"{DIR_PREFIX}{os.getpid()}-")
        os.chmod(self.dir, 0o755)  # munged wants every directory above its socket searchable
        self.conf = os.path.join(self.dir, "slurm.conf")
        self.munge_socket = os.path.join(self.dir, "munge.socket")
        self.daemons: Dict[str, subprocess.Popen] = {}  # "slurmctld", "slurmd-<host>"
        self.munged_pid: Optional[int] = None
        self._torn_down = False
        _live.append(self)
        try:
            self._write_config(cpus_per_node)
            self._start_munged()
            self._start("slurmctld", self.controller, ["slurmctld", "-D", "-c", "-i", "-f", self.conf])
            for host in self.hosts:
                self.start_slurmd(host)
            self.wait_nodes_idle(self.hosts)
        except BaseException:
            self.teardown()
            raise

    # ------------------------------------------------------------ configuration and daemons

    def _write_config(self, cpus):
        d = self.dir
        for sub in ["state"] + [f"spool-{h}" for h in self.hosts]:
            os.makedirs(os.path.join(d, sub))
        with open(os.path.join(d, "cgroup.conf"), "w") as f:
            # 22.05's slurmd cannot run without a cgroup plugin; the hosts' /sys has no cgroup
            # mounts (`ip netns exec` remounts it), so each slurmd gets an empty v1 tree of its own.
            f.write("CgroupPlugin=cgroup/v1\nCgroupAutomount=no\nConstrainCores=no\nConstrainRAMSpace=no\n")
        ctl = self.sim.hosts[self.controller]
        nodes = "".join(f"NodeName={h.name} NodeAddr={h.address} CPUs={cpus} State=UNKNOWN\n"
                        for h in self.sim.hosts.values())
        text = f"""# written by tests/support/simslurm.py for one test run
ClusterName=sim
SlurmctldHost={ctl.name}({ctl.address})
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket={self.munge_socket}
CredType=cred/munge
StateSaveLocation={d}/state
SlurmdSpoolDir={d}/spool-%n
SlurmctldPidFile={d}/slurmctld.pid
SlurmdPidFile={d}/slurmd-%n.pid
SlurmctldLogFile={d}/slurmctld.log
SlurmdLogFile={d}/slurmd-%n.log
SlurmdParameters=config_overrides
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SchedulerType=sched/builtin
MpiDefault=none
ReturnToService=2
SlurmdTimeout={SLURMD_TIMEOUT_S}
MessageTimeout=5
KillWait=5
MinJobAge=2
InactiveLimit=0
{nodes}PartitionName=sim Nodes=ALL Default=YES MaxTime=INFINITE State=UP
"""
        with open(self.conf, "w") as f:
            f.write(text)

    def _start_munged(self):
        key = os.path.join(self.dir, "munge.key")
        with open(key, "wb") as f:
            f.write(os.urandom(1024))
        os.chmod(key, 0o400)
        pid_file = os.path.join(self.dir, "munged.pid")
        proc = subprocess.run(["munged", "--force", f"--socket={self.munge_socket}", f"--key-file={key}",
                               f"--log-file={self.dir}/munged.log", f"--pid-file={pid_file}",
                               f"--seed-file={self.dir}/munged.seed"],
                              capture_output=True, text=True, timeout=START_TIMEOUT_S, stdin=subprocess.DEVNULL)
        if proc.returncode != 0:
            raise SimSlurmError(f"munged did not start: {proc.stderr.strip()}")
        with open(pid_file) as f:
            self.munged_pid = int(f.read().strip())

    def _start(self, label, host, argv):
        log = open(os.path.join(self.dir, f"{label}.out"), "ab")
        try:
            self.daemons[label] = subprocess.Popen(self.sim.command_in(host, argv), env=self.env(),
                                                   stdout=log, stderr=log, stdin=subprocess.DEVNULL,
                                                   start_new_session=True)
        finally:
            log.close()

    def start_slurmd(self, host):
        """(Re)start the host's slurmd under its NodeName."""
        self._start(f"slurmd-{host}", host, ["sh", "-c", CGROUP_MOUNT + ' && exec "$@"', "slurmd", "slurmd", "-D", "-N",
                                             host, "-f", self.conf])

    def env(self, extra=None):
        return self.sim.env(dict({"SLURM_CONF": self.conf}, **(extra or {})))

    def log(self, name):
        try:
            with open(os.path.join(self.dir, name), errors="replace") as f:
                return f.read()
        except OSError:
            return ""

    def logs(self):
        """Every daemon's log, for a failure message."""
        names = sorted(n for n in os.listdir(self.dir) if n.endswith((".log", ".out")))
        return "\n".join(f"--- {n} ---\n{self.log(n)[-4000:]}" for n in names)

    # ------------------------------------------------------------ commands

    def run(self, host, argv, timeout, env=None):
        """``argv`` on ``host`` with SLURM_CONF set; simhosts' hard timeout."""
        return self.sim.run(host, argv, timeout=timeout, env=dict({"SLURM_CONF": self.conf}, **(env or {})))

    def _query(self, argv, timeout=20):
        return self.run(self.controller, argv, timeout=timeout)

    def node_states(self) -> Dict[str, str]:
        out = self._query(["sinfo", "-h", "-N", "-o", "%N %T"]).stdout
        return dict(line.split()[:2] for line in out.splitlines() if len(line.split()) >= 2)

    def wait_nodes_idle(self, hosts, timeout=START_TIMEOUT_S):
        end = time.monotonic() + timeout
        states = {}
        while time.monotonic() < end:
            for label, proc in self.daemons.items():
                if proc.poll() is not None:
                    raise SimSlurmError(f"{label} exited with {proc.returncode}\n{self.logs()}")
            try:
                states = self.node_states()
            except AssertionError:
                states = {}
            if all(states.get(h) == "idle" for h in hosts):  # "idle*": not responding
                return
            time.sleep(0.3)
        raise SimSlurmError(f"the nodes are not idle after {timeout} s: {states}\n{self.logs()}")

    def squeue(self) -> List[str]:
        """The jobs the controller still holds as pending, running or completing."""
        out = self._query(["squeue", "-h", "-o", "%i %T %N"]).stdout
        return [line for line in out.splitlines() if line.strip()]

    def wait_queue_empty(self, timeout):
        end = time.monotonic() + timeout
        left = self.squeue()
        while left and time.monotonic() < end:
            time.sleep(0.5)
            left = self.squeue()
        return left

    def job_processes(self) -> Dict[str, List[int]]:
        """Pids on each host other than its sshd and the Slurm daemons (empty lists: clean)."""
        daemons = {p.pid for p in self.daemons.values() if p.poll() is None}
        ctld = self.daemons.get("slurmctld")
        if ctld is not None:
            daemons |= set(_children(ctld.pid))  # slurmctld's slurmscriptd
        return {host: [p for p in pids if p not in daemons] for host, pids in self.sim.processes().items()}

    def describe_processes(self, found: Dict[str, List[int]]) -> Dict[str, List[str]]:
        """pid: command line, for a failure message."""
        def cmdline(pid):
            try:
                with open(f"/proc/{pid}/cmdline", "rb") as f:
                    return f"{pid}: " + f.read().replace(b"\0", b" ").decode(errors="replace").strip()
            except OSError:
                return f"{pid}: (gone)"
        return {host: [cmdline(p) for p in pids] for host, pids in found.items() if pids}

    def cancel_everything(self):
        """Cancel every job, then kill what is left of them on the hosts."""
        try:
            self._query(["scancel", "--full", "--user=root"], timeout=STOP_TIMEOUT_S)
        except AssertionError:
            pass
        end = time.monotonic() + STOP_TIMEOUT_S
        while any(self.job_processes().values()) and time.monotonic() < end:
            for pids in self.job_processes().values():
                for pid in pids:
                    try:
                        os.kill(pid, signal.SIGKILL)
                    except ProcessLookupError:
                        pass
            time.sleep(0.05)

    def restore(self, hosts):
        """Bring every host back: linked, serving ssh, its slurmd running and the node idle."""
        for host in hosts:
            self.sim.heal(host)
            if host not in self.sim.sshd:
                self.sim.boot(host)
            proc = self.daemons.get(f"slurmd-{host}")
            if proc is None or proc.poll() is not None:
                self.start_slurmd(host)
        self.wait_nodes_idle(hosts)

    # ------------------------------------------------------------ teardown

    def teardown(self):
        if self._torn_down:
            return
        self._torn_down = True
        ctld = self.daemons.get("slurmctld")
        if ctld is not None and ctld.poll() is None:
            try:
                self.run(self.controller, ["scancel", "--full", "--user=root"], timeout=STOP_TIMEOUT_S)
            except (AssertionError, OSError, simhosts.SimHostsError):
                pass
        for label, proc in self.daemons.items():
            if proc.poll() is None:
                try:
                    os.killpg(proc.pid, signal.SIGTERM)
                    proc.wait(STOP_TIMEOUT_S)
                except (ProcessLookupError, subprocess.TimeoutExpired):
                    pass
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            proc.wait()
        if self.munged_pid:
            try:
                os.kill(self.munged_pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        # slurmstepd and job processes left on the hosts (a crash test's leftovers)
        self.sim.kill_everything()
        shutil.rmtree(self.dir, ignore_errors=True)
        if self in _live:
            _live.remove(self)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.teardown()
