"""Which hosts an elastic job keeps after a failed generation.

A rank that dies while its host still answers is a *worker* failure (an OOM kill, a user's kill,
a bug that a fresh start gets past): the next generation starts on the same hosts, as torchrun
restarts the workers of a node. A host is blacklisted only when

* it is *lost*: it no longer answers ssh after the failure (crashed, powered off, link cut);
* its ranks failed in FAILURES_IN_A_ROW generations in a row: a second failure right after a
  fresh start there points at the host (a bad device, a full disk, memory pressure), and moving
  off it is cheaper than spending more restarts on it.

K = 2 is the smallest count that gives every host a second chance (Horovod 0.28.1 blacklists at
the first failure, so a one-host job could not survive one killed rank; torchrun never moves).
A generation in which a host's ranks did not fail ends its run of failures.

Blacklisting is for the rest of the run, as Horovod's, unless horovodrun's
``--blacklist-cooldown-range MIN MAX`` is given: then the n-th blacklisting of a host lasts
MIN * 2**(n-1) seconds, at most MAX (exponential backoff within the range; Horovod adds a
random part, we keep it exact so the user can tell when the host returns), and the host is
usable again once its cooldown is over.
"""
import time
from dataclasses import dataclass
from typing import Dict, Iterable, List, Optional, Tuple

FAILURES_IN_A_ROW = 2
# horovodrun's bounds on --blacklist-cooldown-range (horovod/runner/elastic/discovery.py).
COOLDOWN_LOWEST_S = 1
COOLDOWN_HIGHEST_S = 3600


def check_cooldown_range(pair) -> Optional[str]:
    """One line for a bad --blacklist-cooldown-range, or None."""
    if pair is None:
        return None
    low, high = pair
    if not COOLDOWN_LOWEST_S <= low <= high <= COOLDOWN_HIGHEST_S:
        return (f"--blacklist-cooldown-range needs {COOLDOWN_LOWEST_S} <= MIN <= MAX <= {COOLDOWN_HIGHEST_S} "
                f"seconds, not {low} {high}")
    return None


def cooldown_seconds(pair, times_blacklisted) -> float:
    """How long the ``times_blacklisted``-th blacklisting (1, 2, ...) lasts."""
    low, high = pair
    return float(min(high, low * 2 ** (times_blacklisted - 1)))


@dataclass(frozen=True)
class Verdict:
    host: str
    blacklisted: bool
    text: str  # what the driver's line says about the host


class HostHealth:
    """Failures in a row per host, and how often each was blacklisted (for the backoff)."""

    def __init__(self, host_set, cooldown_range=None, clock=time.monotonic):
        self.hosts = host_set
        self.cooldown_range = tuple(cooldown_range) if cooldown_range else None
        self.clock = clock
        self.in_a_row: Dict[str, int] = {}
        self.times_blacklisted: Dict[str, int] = {}

    def _ban(self, host, why) -> str:
        if self.cooldown_range is None:
            self.hosts.ban(host, why)
            return f"host {host} blacklisted"
        n = self.times_blacklisted.get(host, 0) + 1
        self.times_blacklisted[host] = n
        seconds = cooldown_seconds(self.cooldown_range, n)
        self.hosts.ban(host, why, until=self.clock() + seconds)
        low, high = self.cooldown_range
        return f"host {host} blacklisted for {seconds:g} s (--blacklist-cooldown-range {low} {high})"

    def judge(self, ran_on: Iterable[str], failed: Iterable[str], lost: Iterable[str], why) -> List[Verdict]:
        """After a failed generation: ``ran_on`` its hosts, ``failed`` those with a rank that
        failed by itself, ``lost`` those that no longer answer. Blacklists what must go and
        returns a verdict for every failed or lost host."""
        failed, lost = list(dict.fromkeys(failed)), list(dict.fromkeys(lost))
        for host in ran_on:
            if host not in failed and host not in lost:
                self.in_a_row.pop(host, None)  # a generation without a failure there ends the run
        verdicts = []
        for host in lost:
            self.in_a_row.pop(host, None)
            verdicts.append(Verdict(host, True, self._ban(host, why)))
        for host in failed:
            if host in lost:
                continue
            count = self.in_a_row.get(host, 0) + 1
            if count >= FAILURES_IN_A_ROW:
                self.in_a_row.pop(host, None)
                text = f"{self._ban(host, why)}: its ranks failed {count} generations in a row"
                verdicts.append(Verdict(host, True, text))
            else:
                self.in_a_row[host] = count
                verdicts.append(Verdict(host, False, f"host {host} kept: it still answers (a worker failure; {count} in a "
                                                     f"row there, {FAILURES_IN_A_ROW} blacklist it)"))
        return verdicts

    def every_host_blacklisted(self) -> Tuple[bool, List[str]]:
        """(whether the hosts listed now are all blacklisted, the blacklisted ones)."""
        listed = self.hosts.listed()
        banned = [h for h in listed if h in self.hosts.blacklist]
        return bool(listed) and len(banned) == len(listed), banned
