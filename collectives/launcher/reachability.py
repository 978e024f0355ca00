"""Checks, before anything is launched, that every host can be used: its name resolves, and a
remote one answers ssh without a password prompt. A bad host otherwise surfaces as a hang or
a page of launcher errors; here it becomes one line naming the host.

A host is local when one of its addresses is a loopback address or can be bound on this
machine; local hosts need no ssh (the launcher forks its proxies).
"""
import ipaddress
import shutil
import socket
import subprocess
import threading
from dataclasses import dataclass
from typing import Dict, List


class UnreachableHostError(Exception):
    """A host that cannot be used; the message is one line naming it."""


@dataclass(frozen=True)
class HostStatus:
    name: str
    addresses: tuple
    local: bool

    @property
    def loopback_only(self):
        """Named by a loopback address (localhost): other machines cannot reach it by that name."""
        return all(_is_loopback(a) for a in self.addresses)


def _is_loopback(address):
    try:
        return ipaddress.ip_address(address.split("%")[0]).is_loopback
    except ValueError:
        return False


def _in_thread(fn, timeout, what):
    """fn() with a deadline; getaddrinfo and friends have none of their own. The worker thread
    is a daemon so a stuck resolver cannot keep the launcher from exiting."""
    box = {}

    def target():
        try:
            box["value"] = fn()
        except Exception as e:  # noqa: BLE001 - handed to the caller below
            box["error"] = e

    t = threading.Thread(target=target, daemon=True)
    t.start()
    t.join(timeout)
    if t.is_alive():
        raise UnreachableHostError(f"{what}: no answer within {timeout:g} s")
    if "error" in box:
        raise box["error"]
    return box["value"]


def resolve(name, timeout) -> tuple:
    def lookup():
        return tuple(sorted({info[4][0] for info in socket.getaddrinfo(name, None, type=socket.SOCK_STREAM)}))
    try:
        return _in_thread(lookup, timeout, f"cannot resolve host '{name}'")
    except socket.gaierror as e:
        raise UnreachableHostError(f"cannot resolve host '{name}': {e.strerror}") from None


def is_local_address(address) -> bool:
    if _is_loopback(address):
        return True
    try:
        family = socket.AF_INET6 if ipaddress.ip_address(address.split("%")[0]).version == 6 else socket.AF_INET
    except ValueError:
        return False
    try:
        with socket.socket(family, socket.SOCK_DGRAM) as s:
            s.bind((address, 0))  # only addresses of this machine's interfaces can be bound
        return True
    except OSError:
        return False


def check_ssh(name, timeout):
    """``ssh host true`` in batch mode (a password prompt would hang the launch)."""
    ssh = shutil.which("ssh")
    if ssh is None:
        raise UnreachableHostError(f"host '{name}' is remote and needs ssh, but no ssh client is installed")
    cmd = [ssh, "-o", "BatchMode=yes", "-o", f"ConnectTimeout={max(1, int(timeout))}", name, "true"]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout + 5, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        raise UnreachableHostError(f"cannot reach host '{name}' over ssh: no answer within {timeout:g} s") from None
    if proc.returncode != 0:
        raise UnreachableHostError(ssh_failure(name, proc.returncode, proc.stderr))


def ssh_failure(name, returncode, stderr):
    """The one line for a failed ``ssh host true``: ssh's own last line (without its "ssh: "
    prefix, which the message already implies), and for a refused login what is needed."""
    lines = [line.strip() for line in stderr.splitlines() if line.strip()]
    reason = lines[-1] if lines else f"ssh exited with {returncode}"
    if reason.startswith("ssh: "):
        reason = reason[len("ssh: "):]
    if "permission denied" in reason.lower():
        return (f"host '{name}' refused the ssh login ({reason.rstrip('.')}); collectivesrun needs ssh to "
                "every remote host without a password prompt (a key, as for horovodrun)")
    return f"cannot reach host '{name}' over ssh: {reason}"


def check_hosts(names: List[str], timeout) -> Dict[str, HostStatus]:
    """Resolve every host and ssh-check the remote ones, all in parallel; the failures (in the
    order given, each naming its host) are raised together as one UnreachableHostError."""
    names = list(dict.fromkeys(names))
    results, errors = {}, {}

    def check(name):
        try:
            addresses = resolve(name, timeout)
            local = any(is_local_address(a) for a in addresses)
            if not local:
                check_ssh(name, timeout)
            results[name] = HostStatus(name, addresses, local)
        except UnreachableHostError as e:
            errors[name] = e

    threads = [threading.Thread(target=check, args=(n,), daemon=True) for n in names]
    for t in threads:
        t.start()
    for t in threads:
        t.join(2 * timeout + 10)
    failures = []
    for name in names:
        if name in errors:
            failures.append(str(errors[name]))
        elif name not in results:
            failures.append(f"checking host '{name}' did not finish within {2 * timeout + 10:g} s")
    if failures:
        raise UnreachableHostError("; ".join(failures))
    return results
