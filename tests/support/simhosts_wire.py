"""The wire format shared by the ssh stand-in (simhosts_ssh.py) and its server (simhosts_sshd.py).

The client sends one JSON line ({"user": ..., "command": ...}); then both sides send frames of
``channel (1 byte) | length (4 bytes, big-endian) | data``: the client its stdin (STDIN; an
empty frame is end of input), the server the command's STDOUT and STDERR and finally its EXIT
status (a decimal number). A connection that ends without EXIT is a lost session, as in ssh.
"""
import os
import struct

STDIN, STDOUT, STDERR, EXIT = 0, 1, 2, 3
PORT = 22
_HEADER = struct.Struct(">BI")


def frame(channel, data=b""):
    return _HEADER.pack(channel, len(data)) + data


def read_exact(sock, n):
    """n bytes from sock, or None when the connection ends first."""
    chunks = []
    while n:
        chunk = sock.recv(n)
        if not chunk:
            return None
        chunks.append(chunk)
        n -= len(chunk)
    return b"".join(chunks)


def read_line(sock, limit=1 << 20):
    """The header line, read a byte at a time so that no frame after it is consumed; None when
    the connection ends first."""
    line = bytearray()
    while not line.endswith(b"\n"):
        byte = sock.recv(1)
        if not byte or len(line) > limit:
            return None
        line += byte
    return bytes(line)


def read_frame(sock):
    """(channel, data), or None when the connection ends."""
    header = read_exact(sock, _HEADER.size)
    if header is None:
        return None
    channel, length = _HEADER.unpack(header)
    data = read_exact(sock, length) if length else b""
    return None if data is None else (channel, data)


def write_all(fd, data):
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]
