"""Host lists: ``-H host1:2,host2:2`` and host files, and how many ranks land on each host.

Host files take horovodrun's form (``host slots=N``), MPICH's (``host:N``) and a bare ``host``
(one slot), one per line, ``#`` starting a comment. Both are turned into one list that the
command builder writes in the launcher's own syntax, so either form works with either MPI.
"""
from dataclasses import dataclass
from typing import List


class HostSpecError(ValueError):
    """A malformed host list or host file; the message is one line for the user."""


@dataclass(frozen=True)
class Host:
    name: str
    slots: int


def _slots(text, where):
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise HostSpecError(f"{where}: slots must be a positive integer, not {text!r}")
    return value


def _host(entry, where):
    entry = entry.strip()
    if not entry:
        raise HostSpecError(f"{where}: empty host entry")
    # Bracketed IPv6 addresses carry colons of their own: [fe80::1]:2
    if entry.startswith("["):
        name, _, rest = entry[1:].partition("]")
        if rest and not rest.startswith(":"):
            raise HostSpecError(f"{where}: cannot read {entry!r} (expected [address]:slots)")
        return Host(name, _slots(rest[1:], where) if rest else 1)
    name, sep, slots = entry.rpartition(":")
    if not sep:
        return Host(entry, 1)
    if ":" in name:  # a bare IPv6 address without brackets
        return Host(entry, 1)
    return Host(name, _slots(slots, where))


def parse_host_list(text) -> List[Host]:
    """``host1:2,host2:4,host3`` (no slot count means one)."""
    return [_host(entry, f"-H {text}") for entry in text.split(",")]


def parse_hostfile(path) -> List[Host]:
    try:
        with open(path) as f:
            lines = f.readlines()
    except OSError as e:
        raise HostSpecError(f"cannot read host file {path}: {e.strerror or e}") from None
    hosts = []
    for number, line in enumerate(lines, 1):
        words = line.split("#", 1)[0].split()
        if not words:
            continue
        where = f"{path}:{number}"
        host = _host(words[0], where)
        for word in words[1:]:
            key, _, value = word.partition("=")
            if key == "slots":
                host = Host(host.name, _slots(value, where))
            elif key not in ("max_slots", "max-slots"):  # Open MPI's cap; the launcher does not need it
                raise HostSpecError(f"{where}: unknown field {word!r} (expected `host slots=N`)")
        hosts.append(host)
    if not hosts:
        raise HostSpecError(f"host file {path} lists no hosts")
    return hosts


def ranks_per_host(np, hosts: List[Host]) -> List[int]:
    """How many of ``np`` ranks each host receives: hosts are filled slot by slot in order and,
    when ``np`` exceeds the slots, the list is walked again (MPICH's placement)."""
    counts = [0] * len(hosts)
    remaining = np
    while remaining > 0:
        for i, host in enumerate(hosts):
            take = min(host.slots, remaining)
            counts[i] += take
            remaining -= take
            if remaining == 0:
                break
    return counts


def ranks_on_hosts(np, hosts: List[Host]) -> List[List[int]]:
    """The ranks each host receives, in the same walk as ranks_per_host: rank numbers are
    handed out slot by slot in host order (host1's first, then host2's, ...)."""
    ranks: List[List[int]] = [[] for _ in hosts]
    rank = 0
    while rank < np:
        for i, host in enumerate(hosts):
            take = min(host.slots, np - rank)
            ranks[i].extend(range(rank, rank + take))
            rank += take
            if rank == np:
                break
    return ranks
