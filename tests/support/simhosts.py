"""Simulated hosts for tests that span machines: each host is a network namespace with its own
address, hostname and /etc/hosts, joined to the others by a veth link into a private bridge, so
traffic between hosts is real TCP over a link that can be cut, shaped or lost with its host.

    with SimHosts(["hosta", "hostb", "hostc"]) as sim:
        run = sim.run("hosta", [python, "-m", "collectives.run", "-np", "4", "-H", "hosta:2,hostb:1,hostc:1",
                                python, "train.py"], timeout=60)
        sim.cut("hostb"); sim.heal("hostb"); sim.shape("hostb", "1gbit"); sim.crash("hostc"); sim.boot("hostc")

``sim.run(host, argv)`` runs a command on a host as at its console (``ip netns exec NS
unshare --uts`` under the host's name). Every host runs a small sshd (tests/support/simhosts_sshd.py) and
``sim.env()`` puts an ``ssh`` client stand-in first on PATH (tests/support/simhosts_ssh.py), which MPICH's
ssh launcher and collectivesrun's reachability check use unchanged: a session's command, output
and exit status travel over the links, so a cut link stalls it as it would stall ssh.
``sim.refuse(host)`` makes a host's sshd refuse logins (a missing key).

Only this run's namespaces hold addresses (a private /24; the bridge has none, and no
namespace has a route out), so no traffic leaves them. Names carry the owner's pid: at start,
leftovers of runs whose owner is gone (killed with SIGKILL) are removed; teardown removes
processes, namespaces, veths, the bridge and the per-host files whatever happened, from the
context manager, at exit, and on SIGTERM/SIGHUP.

Needs root and a kernel that lets it create namespaces; ``unavailable_reason()`` says why not.
"""
import atexit
import ipaddress
import os
import random
import re
import select
import shutil
import signal
import string
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from typing import Dict, List, Optional

HERE = os.path.dirname(os.path.abspath(__file__))
SSH_CLIENT = os.path.join(HERE, "simhosts_ssh.py")
SSH_SERVER = os.path.join(HERE, "simhosts_sshd.py")
NETNS_ETC = "/etc/netns"  # `ip netns exec NS` bind-mounts /etc/netns/NS/* over /etc/*
INNER_IFACE = "eth0"  # every host's link has the same name inside its namespace, as on real machines
# Interface names are at most 15 characters: "cs" + owner pid (hex) + "-" + 2 random + role.
NAME = re.compile(r"^cs(?P<pid>[0-9a-f]+)-(?P<tag>[0-9a-z]{2})(?P<role>b|v\d+|h\d+)$")
COMMAND_TIMEOUT_S = 20


class SimHostsError(RuntimeError):
    pass


def _run(argv, check=True, timeout=COMMAND_TIMEOUT_S):
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)
    if check and proc.returncode != 0:
        raise SimHostsError(f"{' '.join(argv)} failed ({proc.returncode}): {proc.stderr.strip()}")
    return proc


_reason = ()  # cached unavailable_reason(); () = not asked yet


def unavailable_reason() -> Optional[str]:
    """None when simulated hosts can be made here, else why not (for pytest.skip)."""
    global _reason
    if _reason != ():
        return _reason
    _reason = _probe()
    return _reason


def _probe():
    if not hasattr(os, "geteuid") or os.geteuid() != 0:
        return "simulated hosts need root (network namespaces, veth links, a bridge)"
    for tool in ("ip", "unshare", "tc"):
        if shutil.which(tool) is None:
            return f"simulated hosts need `{tool}`, which is not installed"
    prefix = f"cs{os.getpid():x}-{_tag()}"
    netns, bridge = f"{prefix}h0", f"{prefix}b"
    proc = _run(["ip", "netns", "add", netns], check=False)
    if proc.returncode != 0:
        return f"`ip netns add` fails here (it needs CAP_SYS_ADMIN and CAP_NET_ADMIN): {proc.stderr.strip()}"
    etc = os.path.join(NETNS_ETC, netns)
    try:
        try:
            os.makedirs(etc)
            with open(os.path.join(etc, "hosts"), "w") as f:
                f.write("127.0.0.1 localhost\n")
        except OSError as e:
            return f"cannot write {etc} (each host's /etc/hosts): {e.strerror or e}"
        proc = _run(["ip", "netns", "exec", netns, "unshare", "--uts", "hostname", "probe"], check=False)
        if proc.returncode != 0:
            return f"cannot run a command in a namespace of its own hostname here: {proc.stderr.strip()}"
        proc = _run(["ip", "link", "add", bridge, "type", "bridge"], check=False)
        if proc.returncode != 0:
            return f"cannot create a bridge here: {proc.stderr.strip()}"
        _run(["ip", "link", "del", bridge], check=False)
    finally:
        _run(["ip", "netns", "del", netns], check=False)
        shutil.rmtree(etc, ignore_errors=True)
    return None


def _tag():
    return "".join(random.choice(string.ascii_lowercase + string.digits) for _ in range(2))


def _alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _our_netns():
    out = _run(["ip", "netns", "list"], check=False).stdout
    return [line.split()[0] for line in out.splitlines() if line.strip() and NAME.match(line.split()[0])]


def _our_links():
    out = _run(["ip", "-o", "link", "show"], check=False).stdout
    names = [m.group(1) for m in re.finditer(r"^\d+:\s+([^:@\s]+)", out, re.M)]
    return [n for n in names if NAME.match(n)]


def netns_pids(netns) -> List[int]:
    out = _run(["ip", "netns", "pids", netns], check=False).stdout
    return [int(p) for p in out.split() if p.isdigit()]


def kill_netns_processes(netns, deadline_s=10.0):
    """SIGKILL everything in ``netns`` until nothing is left (children may be forked meanwhile)."""
    end = time.monotonic() + deadline_s
    while True:
        pids = netns_pids(netns)
        if not pids:
            return
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        if time.monotonic() > end:
            raise SimHostsError(f"processes {pids} in {netns} survive SIGKILL")
        time.sleep(0.05)


def _remove(netns_names, link_names):
    """Processes first (a namespace lives on while anything holds it), then the links (the
    root-side veths take their peers with them), then the names and their /etc/netns files."""
    for ns in netns_names:
        try:
            kill_netns_processes(ns)
        except SimHostsError:
            pass
    for link in sorted(link_names, key=lambda n: n.endswith("b")):  # veths before the bridge
        _run(["ip", "link", "del", link], check=False)
    for ns in netns_names:
        _run(["ip", "netns", "del", ns], check=False)
        shutil.rmtree(os.path.join(NETNS_ETC, ns), ignore_errors=True)


def remove_leftovers():
    """Remove what earlier runs left behind: names whose owner process is gone, and names with
    this process's pid that no live SimHosts of this process owns (a reused pid)."""
    live = {sim.prefix for sim in _live}

    def stale(name):
        m = NAME.match(name)
        pid = int(m.group("pid"), 16)
        if pid == os.getpid():
            return f"cs{m.group('pid')}-{m.group('tag')}" not in live
        return not _alive(pid)

    netns = [n for n in _our_netns() if stale(n)]
    links = [n for n in _our_links() if stale(n)]
    if os.path.isdir(NETNS_ETC):
        netns += [n for n in os.listdir(NETNS_ETC) if NAME.match(n) and stale(n) and n not in netns]
    _remove(netns, links)
    for entry in os.listdir(tempfile.gettempdir()):  # the run directories: simhosts-<prefix>-XXXX
        m = re.match(r"^simhosts-(cs[0-9a-f]+-[0-9a-z]{2})-", entry)
        if m and stale(m.group(1) + "b"):
            shutil.rmtree(os.path.join(tempfile.gettempdir(), entry), ignore_errors=True)


@dataclass(frozen=True)
class SimHost:
    name: str  # its hostname, resolvable on every simulated host
    address: str
    netns: str
    veth: str  # the root-namespace end of its link (down = cable pulled)


@dataclass
class Result:
    returncode: int
    stdout: str
    stderr: str
    elapsed_s: float

    def describe(self):
        return (f"exit code {self.returncode} after {self.elapsed_s:.1f} s\n--- stdout ---\n{self.stdout}\n"
                f"--- stderr ---\n{self.stderr}")


_live = []  # SimHosts not yet torn down, for the exit and signal guards
_guard_installed = False


def _teardown_all():
    for sim in list(_live):
        sim.teardown()


def _on_signal(signum, frame):
    _teardown_all()
    signal.signal(signum, signal.SIG_DFL)
    os.kill(os.getpid(), signum)


def _install_guard():
    global _guard_installed
    if _guard_installed:
        return
    atexit.register(_teardown_all)
    for sig in (signal.SIGTERM, signal.SIGHUP):
        if signal.getsignal(sig) in (signal.SIG_DFL, None):
            signal.signal(sig, _on_signal)
    _guard_installed = True


def _subnet():
    """A private /24 not routed in the root namespace (the hosts' own namespaces are isolated
    from it anyway; this only avoids confusing anyone reading `ip route`)."""
    routes = _run(["ip", "-4", "route", "show"], check=False).stdout + \
        _run(["ip", "-4", "-o", "addr", "show"], check=False).stdout
    used = [ipaddress.ip_network(m, strict=False) for m in re.findall(r"\b(\d+\.\d+\.\d+\.\d+/\d+)", routes)]
    start = os.getpid() % 200
    for i in range(250):
        net = ipaddress.ip_network(f"10.213.{(start + i) % 250 + 1}.0/24")
        if not any(net.overlaps(u) for u in used):
            return net
    raise SimHostsError("no free 10.213.x.0/24 for the simulated hosts")


class SimHosts:
    """K simulated hosts on one bridge; a context manager that always tears them down."""

    def __init__(self, names: List[str]):
        reason = unavailable_reason()
        if reason:
            raise SimHostsError(reason)
        if len(set(names)) != len(names) or not names:
            raise ValueError(f"host names must be distinct and non-empty: {names}")
        remove_leftovers()
        _install_guard()
        self.prefix = f"cs{os.getpid():x}-{_tag()}"
        while self.prefix in {sim.prefix for sim in _live}:
            self.prefix = f"cs{os.getpid():x}-{_tag()}"
        self.bridge = f"{self.prefix}b"
        self.dir = tempfile.mkdtemp(prefix=f"simhosts-{self.prefix}-")
        net = _subnet()
        self.hosts: Dict[str, SimHost] = {}
        for i, name in enumerate(names):
            self.hosts[name] = SimHost(name, str(net.network_address + 2 + i), f"{self.prefix}h{i}",
                                       f"{self.prefix}v{i}")
        self.prefixlen = net.prefixlen
        self.sshd: Dict[str, subprocess.Popen] = {}
        self._torn_down = False
        _live.append(self)
        try:
            self._create()
        except BaseException:
            self.teardown()
            raise

    # ------------------------------------------------------------ making and removing

    def _create(self):
        _run(["ip", "link", "add", self.bridge, "type", "bridge"])
        _run(["ip", "link", "set", self.bridge, "up"])
        hosts_file = "127.0.0.1 localhost\n" + "".join(f"{h.address} {h.name}\n" for h in self.hosts.values())
        for h in self.hosts.values():
            _run(["ip", "netns", "add", h.netns])
            etc = os.path.join(NETNS_ETC, h.netns)
            os.makedirs(etc, exist_ok=True)
            with open(os.path.join(etc, "hosts"), "w") as f:
                f.write(hosts_file)
            with open(os.path.join(etc, "resolv.conf"), "w") as f:
                f.write("# simulated host: names come from /etc/hosts only\n")
            _run(["ip", "link", "add", h.veth, "type", "veth", "peer", "name", INNER_IFACE, "netns", h.netns])
            _run(["ip", "link", "set", h.veth, "master", self.bridge, "up"])
            _run(["ip", "-n", h.netns, "addr", "add", f"{h.address}/{self.prefixlen}", "dev", INNER_IFACE])
            _run(["ip", "-n", h.netns, "link", "set", INNER_IFACE, "up"])
            _run(["ip", "-n", h.netns, "link", "set", "lo", "up"])
        self.refuse_dir = os.path.join(self.dir, "refuse")
        os.makedirs(self.refuse_dir)
        self.bindir = os.path.join(self.dir, "bin")
        os.makedirs(self.bindir)
        ssh = os.path.join(self.bindir, "ssh")
        with open(ssh, "w") as f:
            # -E -s: the caller's PYTHON* variables and user site do not reach the stand-in.
            f.write(f"#!/bin/sh\nexec {sys.executable} -E -s {SSH_CLIENT} \"$@\"\n")
        os.chmod(ssh, 0o755)
        for name in self.hosts:
            self.boot(name)

    def boot(self, host):
        """Start the host's sshd (at creation, and again after a crash)."""
        log = open(os.path.join(self.dir, f"sshd-{host}.log"), "ab")
        proc = subprocess.Popen(self.command_in(host, [sys.executable, "-E", "-s", SSH_SERVER, self.refuse_dir]),
                                stdout=subprocess.PIPE, stderr=log, stdin=subprocess.DEVNULL, start_new_session=True)
        log.close()
        ready, _, _ = select.select([proc.stdout], [], [], COMMAND_TIMEOUT_S)
        if not ready or proc.stdout.readline().strip() != b"ready":
            proc.kill()
            proc.wait()
            raise SimHostsError(f"the sshd of {host} did not start; see {self.dir}/sshd-{host}.log")
        proc.stdout.close()
        self.sshd[host] = proc

    def teardown(self):
        if self._torn_down:
            return
        self._torn_down = True
        _remove([h.netns for h in self.hosts.values()], [h.veth for h in self.hosts.values()] + [self.bridge])
        for proc in self.sshd.values():
            try:
                proc.wait(timeout=5)  # killed with its host above; reap it
            except subprocess.TimeoutExpired:
                pass
        shutil.rmtree(self.dir, ignore_errors=True)
        if self in _live:
            _live.remove(self)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.teardown()

    # ------------------------------------------------------------ running commands

    def env(self, extra=None):
        """The environment for a command on a simulated host: the ssh stand-in first on PATH,
        and UCX kept to TCP (UCX otherwise finds the one kernel under all namespaces and moves
        data between hosts through shared memory, bypassing the links)."""
        env = {k: v for k, v in os.environ.items() if not k.startswith(("COLLECTIVES_", "HOROVOD_"))}
        env.update({"PATH": self.bindir + os.pathsep + env.get("PATH", "/usr/bin:/bin"), "PYTHONUNBUFFERED": "1",
                    "UCX_TLS": "tcp,self", "OMP_NUM_THREADS": "1"})
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [HERE, env.get("PYTHONPATH")]))
        env.update(extra or {})
        return env

    def command_in(self, host, argv):
        """argv that runs ``argv`` on ``host`` under its own hostname."""
        h = self.hosts[host]
        return ["ip", "netns", "exec", h.netns, "unshare", "--uts", "sh", "-c", 'hostname "$0" && exec "$@"',
                h.name, *map(str, argv)]

    def popen(self, host, argv, env=None, **kw):
        return subprocess.Popen(self.command_in(host, argv), env=self.env(env), stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True,
                                start_new_session=True, **kw)

    def run(self, host, argv, timeout, env=None):
        """Run ``argv`` on ``host`` with a hard timeout; on timeout the process group and every
        process on every simulated host are killed and AssertionError carries the output."""
        start = time.monotonic()
        proc = self.popen(host, argv, env)
        try:
            out, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.kill_everything(proc)
            out, err = proc.communicate()
            raise AssertionError(f"{argv} on {host} timed out after {timeout} s (killed)\n--- stdout ---\n{out}\n"
                                 f"--- stderr ---\n{err}") from None
        return Result(proc.returncode, out, err, time.monotonic() - start)

    def kill_everything(self, proc=None):
        """Kill ``proc``'s process group and every job on every host (the sshds stay)."""
        if proc is not None:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        end = time.monotonic() + 10
        while any(self.processes().values()) and time.monotonic() < end:
            self.kill_jobs()
            time.sleep(0.05)

    def processes(self) -> Dict[str, List[int]]:
        """Pids running on each host besides its sshd (empty lists when the hosts are clean)."""
        found = {}
        for name, h in self.hosts.items():
            sshd = self.sshd.get(name)
            found[name] = [p for p in netns_pids(h.netns) if sshd is None or p != sshd.pid]
        return found

    def kill_jobs(self):
        """Kill everything on every host but its sshd."""
        for pids in self.processes().values():
            for pid in pids:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass

    def link_bytes(self, host) -> int:
        """Bytes that crossed the host's link so far, both ways (its root-side veth counters)."""
        stats = f"/sys/class/net/{self.hosts[host].veth}/statistics"
        total = 0
        for name in ("rx_bytes", "tx_bytes"):
            with open(os.path.join(stats, name)) as f:
                total += int(f.read())
        return total

    # ------------------------------------------------------------ faults

    def cut(self, host):
        """Pull the host's cable: its link goes down, nothing reaches it or leaves it."""
        _run(["ip", "link", "set", self.hosts[host].veth, "down"])

    def restore(self, hosts):
        """After a test: kill every job, and bring each host back up, linked and serving ssh."""
        self.kill_everything()
        for host in hosts:
            self.heal(host)
            if host not in self.sshd:
                self.boot(host)

    def heal(self, host):
        _run(["ip", "link", "set", self.hosts[host].veth, "up"])

    def shape(self, host, rate, burst="256kb", latency="50ms"):
        """Limit the host's egress to ``rate`` (tc's units: 1gbit, 800mbit) with a token bucket."""
        _run(["ip", "netns", "exec", self.hosts[host].netns, "tc", "qdisc", "replace", "dev", INNER_IFACE, "root",
              "tbf", "rate", rate, "burst", burst, "latency", latency])

    def unshape(self, host):
        _run(["ip", "netns", "exec", self.hosts[host].netns, "tc", "qdisc", "del", "dev", INNER_IFACE, "root"],
             check=False)

    def crash(self, host, power_off=False):
        """The host dies: every process on it (its sshd too) is killed at once. Its kernel still
        closes their connections, so peers see them end; with ``power_off`` the link is cut
        first, so peers hear nothing more, as after a power loss. ``heal`` and ``boot`` bring
        it back."""
        if power_off:
            self.cut(host)
        kill_netns_processes(self.hosts[host].netns)
        proc = self.sshd.pop(host, None)
        if proc is not None:
            proc.wait()

    def refuse(self, host, refuse=True):
        """Make the host's sshd refuse (or again accept) logins."""
        marker = os.path.join(self.dir, "refuse", host)
        if refuse:
            open(marker, "w").close()
        elif os.path.exists(marker):
            os.remove(marker)
