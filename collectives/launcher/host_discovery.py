"""Where an elastic job may run: the hosts a discovery script prints (or a fixed -H/--hostfile
list), minus the blacklisted ones, and which slots of them a generation uses.

A discovery script prints one host per line, ``host:slots`` or a bare ``host`` (then
``--slots-per-host`` slots), as horovodrun's ``--host-discovery-script`` expects. It is run
about once a second; the driver compares what it would launch now with what the running
generation was launched with, and a difference raises the host-set version the workers poll.

Hosts keep the order in which they were first seen, so that hosts already in the job keep the
lowest ranks when others join (Horovod keeps a stable assignment order for the same reason).
"""
import subprocess
import threading
import time
from typing import Dict, List, Optional, Tuple

from . import hosts as hostspec

SCRIPT_TIMEOUT_S = 30.0


class DiscoveryError(RuntimeError):
    """The discovery script failed or printed something unreadable; one line for the user."""


def parse_discovery_output(text, default_slots) -> List[hostspec.Host]:
    """``host:slots`` / ``host`` lines (blank lines and ``#`` comments skipped); a host listed
    twice keeps its last slot count."""
    found: Dict[str, int] = {}
    for number, line in enumerate(text.splitlines(), 1):
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        try:
            host = hostspec._host(line, f"discovery output line {number}")  # noqa: SLF001 - same syntax as -H
        except hostspec.HostSpecError as e:
            raise DiscoveryError(str(e)) from None
        bare = host.name in (line, line.strip("[]"))  # no ":slots" given
        slots = default_slots if bare else host.slots
        found[host.name] = slots
    return [hostspec.Host(name, slots) for name, slots in found.items()]


def run_script(script, default_slots, timeout=SCRIPT_TIMEOUT_S) -> List[hostspec.Host]:
    try:
        proc = subprocess.run([script], capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        raise DiscoveryError(f"host discovery script {script} did not finish within {timeout:g} s") from None
    except OSError as e:
        raise DiscoveryError(f"cannot run host discovery script {script}: {e.strerror or e}") from None
    if proc.returncode != 0:
        last = (proc.stderr.strip().splitlines() or [""])[-1]
        raise DiscoveryError(f"host discovery script {script} exited with {proc.returncode}"
                             + (f": {last}" if last else ""))
    return parse_discovery_output(proc.stdout, default_slots)


def assign(hosts: List[hostspec.Host], max_np: Optional[int]) -> Tuple[Tuple[str, int], ...]:
    """The (host, ranks) a generation launched now would use: every slot, host by host in order,
    up to max_np ranks; hosts that get no rank are left out."""
    total = sum(h.slots for h in hosts)
    np_ = total if max_np is None else min(total, max_np)
    placed = []
    for h in hosts:
        take = min(h.slots, np_)
        if take:
            placed.append((h.name, take))
        np_ -= take
    return tuple(placed)


def describe(assignment) -> str:
    """'hosta:2,hostb:1'"""
    return ",".join(f"{name}:{n}" for name, n in assignment) or "(none)"


class HostSet:
    """The hosts known now (from the script or fixed), their order, and the blacklist.

    ``refresh()`` reruns the script; a failure after the first success is transient (the last
    good list stays, the failure is returned for a warning), as Horovod treats it."""

    def __init__(self, script=None, fixed: Optional[List[hostspec.Host]] = None, default_slots=1):
        self.script = script
        self.default_slots = default_slots
        self.lock = threading.Lock()
        self.order: List[str] = []  # first-seen order of every host ever listed
        self.slots: Dict[str, int] = {}  # the hosts listed by the last good discovery
        self.blacklist: Dict[str, str] = {}  # host -> why
        self.banned_until: Dict[str, float] = {}  # host -> end of its cooldown (time.monotonic); absent: for good
        if fixed is not None:
            self._take(fixed)

    def _take(self, listed: List[hostspec.Host]):
        with self.lock:
            for h in listed:
                if h.name not in self.order:
                    self.order.append(h.name)
            self.slots = {h.name: h.slots for h in listed}

    def refresh(self) -> Optional[str]:
        """Rerun the discovery script; None, or why it failed (the last good list stays)."""
        if self.script is None:
            return None
        try:
            listed = run_script(self.script, self.default_slots)
        except DiscoveryError as e:
            return str(e)
        self._take(listed)
        return None

    def ban(self, host, why, until=None):
        """Blacklist ``host``: for the rest of the run, or until ``until`` (time.monotonic())."""
        with self.lock:
            self.blacklist[host] = why
            if until is None:
                self.banned_until.pop(host, None)
            else:
                self.banned_until[host] = until

    def release_expired(self, now=None) -> List[str]:
        """Take the hosts whose cooldown is over off the blacklist; returns them."""
        now = time.monotonic() if now is None else now
        with self.lock:
            over = [h for h, until in self.banned_until.items() if until <= now]
            for h in over:
                del self.banned_until[h]
                self.blacklist.pop(h, None)
            return over

    def listed(self) -> List[str]:
        """The hosts the last good discovery listed (blacklisted or not), in first-seen order."""
        with self.lock:
            return [name for name in self.order if name in self.slots]

    def usable(self) -> List[hostspec.Host]:
        with self.lock:
            return [hostspec.Host(name, self.slots[name]) for name in self.order
                    if name in self.slots and name not in self.blacklist]

    def usable_slots(self) -> int:
        return sum(h.slots for h in self.usable())
