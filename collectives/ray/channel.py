"""The link between a Ray actor and the rank process it serves: length-prefixed cloudpickle
messages over one TCP connection on the node's loopback.

Standard library and cloudpickle only: the rank process imports this before the engine.
"""
import socket
import struct

import cloudpickle

_HEADER = struct.Struct("!Q")
# The rank processes' environment: the actors' ports, indexed by rank.
PORTS_VARIABLE = "COLLECTIVES_RAY_PORTS"


class ChannelClosed(ConnectionError):
    """The other end closed the connection (its process ended)."""


def send(sock, message):
    data = cloudpickle.dumps(message)
    sock.sendall(_HEADER.pack(len(data)) + data)


def _read_exactly(sock, n):
    chunks, left = [], n
    while left:
        chunk = sock.recv(min(left, 1 << 20))
        if not chunk:
            raise ChannelClosed("the connection closed")
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


def receive(sock):
    (length,) = _HEADER.unpack(_read_exactly(sock, _HEADER.size))
    return cloudpickle.loads(_read_exactly(sock, length))


def listen():
    """A listening socket on this node's loopback (a free port) for the rank process."""
    server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    return server
