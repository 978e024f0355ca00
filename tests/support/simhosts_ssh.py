"""The ``ssh`` of simulated hosts (tests/support/simhosts.py puts a wrapper named ``ssh`` first on PATH):
``ssh [options] [user@]host command...`` as MPICH's ssh launcher and collectivesrun's
reachability check call it.

Like ssh it resolves the host with this host's resolver (/etc/hosts of the simulated host it
runs on), connects to port 22 there (simhosts_sshd.py) over the real links, and relays the
command's stdin, stdout, stderr and exit status through that connection: a cut link stalls
the session (and a connection attempt times out after ConnectTimeout), a crashed host ends
it. Errors read as ssh's and exit 255. Options other than -o ConnectTimeout, -l and -n are
accepted and ignored.
"""
import json
import os
import socket
import sys
import threading

from simhosts_wire import EXIT, PORT, STDERR, STDIN, STDOUT, frame, read_frame, write_all

# ssh(1) options that take a value; any other option letter is a flag.
WITH_VALUE = set("BbcDEeFIiJLlmOoPpQRSWw")


def fail(message):
    sys.stderr.write(message + "\n")
    sys.stderr.flush()
    os._exit(255)


def parse(argv):
    """(-o options by lower-case name, login or None, stdin from /dev/null, host, command words)."""
    options, login, no_stdin, i = {}, None, False, 0
    while i < len(argv) and argv[i].startswith("-") and argv[i] != "--":
        word, j = argv[i], 1
        while j < len(word):
            letter = word[j]
            if letter in WITH_VALUE:
                value = word[j + 1:]
                if not value:
                    i += 1
                    if i >= len(argv):
                        fail(f"option requires an argument -- {letter}")
                    value = argv[i]
                if letter == "o":
                    key, _, val = value.replace("=", " ", 1).partition(" ")
                    options[key.lower()] = val.strip()
                elif letter == "l":
                    login = value
                break
            no_stdin = no_stdin or letter == "n"
            j += 1
        i += 1
    if i < len(argv) and argv[i] == "--":
        i += 1
    if i >= len(argv):
        fail("usage: ssh [options] destination command")
    host = argv[i]
    if "@" in host:
        login, host = host.rsplit("@", 1)
    return options, login, no_stdin, host, argv[i + 1:]


def connect(name, timeout):
    try:
        address = socket.getaddrinfo(name, PORT, socket.AF_INET, socket.SOCK_STREAM)[0][4]
    except socket.gaierror as e:
        fail(f"ssh: Could not resolve hostname {name}: {e.strerror}")
    try:
        sock = socket.create_connection(address, timeout=timeout)
    except TimeoutError:
        fail(f"ssh: connect to host {name} port {PORT}: Connection timed out")
    except OSError as e:
        fail(f"ssh: connect to host {name} port {PORT}: {e.strerror or e}")
    sock.settimeout(None)
    return sock


def pump_stdin(sock, no_stdin):
    try:
        while not no_stdin:
            data = os.read(0, 65536)
            if not data:
                break
            sock.sendall(frame(STDIN, data))
        sock.sendall(frame(STDIN))
    except OSError:
        pass


def main():
    options, login, no_stdin, name, command = parse(sys.argv[1:])
    if not command:
        fail("ssh stand-in: interactive logins are not supported; give a command")
    timeout = float(options["connecttimeout"]) if options.get("connecttimeout") else None
    sock = connect(name, timeout)
    # As ssh, the words are joined with spaces for the remote shell.
    sock.sendall(json.dumps({"user": login or "root", "command": " ".join(command)}).encode() + b"\n")
    threading.Thread(target=pump_stdin, args=(sock, no_stdin), daemon=True).start()
    while True:
        try:
            got = read_frame(sock)
        except OSError:
            got = None
        if got is None:
            fail(f"Connection to {name} closed by remote host.")
        channel, data = got
        if channel in (STDOUT, STDERR):
            write_all(channel, data)
        elif channel == EXIT:
            os._exit(int(data))


if __name__ == "__main__":
    main()
