"""One rank of a Ray job: MPICH's proxy (started inside a Ray actor) starts
``python -m collectives.ray.rank_process`` for every rank of its node.

The process connects to the actor that owns its rank (the port list is in
COLLECTIVES_RAY_PORTS, indexed by PMI_RANK), takes its set-up (environment, import path, the
executable class), starts the engine (``collectives.init()``: a real MPI world among the ranks),
and then runs the functions the actor forwards, one at a time, answering each with
("ok", value) or ("error", exception, traceback).

It ends itself by SIGKILL when its actor's connection closes (the actor, or its node, is gone)
or when the proxy that started it dies: a rank killed by a signal makes MPICH's launcher end
the whole world at once, so no rank is left waiting on a lost peer.
"""
import ctypes
import os
import queue
import signal
import socket
import sys
import threading
import traceback

import cloudpickle

from collectives.ray import channel

CONNECT_TIMEOUT_S = 30.0


def _die_with_parent():
    if sys.platform.startswith("linux"):
        try:
            ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGKILL), 0, 0, 0)  # PR_SET_PDEATHSIG
        except (OSError, AttributeError):
            pass


def _die():
    sys.stdout.flush()
    sys.stderr.flush()
    os.kill(os.getpid(), signal.SIGKILL)


_stopping = threading.Event()  # asked to stop: the actor closing the connection is expected then


def _reader(sock, inbox):
    """Every message from the actor into ``inbox``; the end of the connection ends this process."""
    try:
        while True:
            message = channel.receive(sock)
            if message[0] == "stop":
                _stopping.set()
            inbox.put(message)
    except Exception:  # noqa: BLE001 - closed, reset or garbage: the actor is gone either way
        if not _stopping.is_set():
            _die()


def _answer(sock, outcome):
    try:
        channel.send(sock, outcome)
    except Exception as e:  # noqa: BLE001 - an unpicklable value or exception
        if isinstance(e, OSError):
            _die()
        channel.send(sock, ("error", RuntimeError(f"the result cannot be pickled: {e}"), ""))


class RankProcess:
    def __init__(self, sock, setup):
        self.sock = sock
        self.executable = None
        os.environ.update({k: str(v) for k, v in setup.get("env", {}).items()})
        sys.path[:0] = [p for p in setup.get("sys_path", []) if p not in sys.path]
        self.elastic = setup.get("elastic", False)

    def start(self, setup):
        import collectives
        collectives.init()
        if setup.get("executable"):
            cls, args, kwargs = cloudpickle.loads(setup["executable"])
            self.executable = cls(*args, **kwargs)
        return {"rank": collectives.rank(), "size": collectives.size(), "local_rank": collectives.local_rank(),
                "local_size": collectives.local_size(), "cross_rank": collectives.cross_rank(),
                "cross_size": collectives.cross_size(), "hostname": socket.gethostname(), "pid": os.getpid()}

    def call(self, kind, payload):
        fn, args, kwargs = cloudpickle.loads(payload)
        if kind == "execute":
            return fn(self.executable)
        return fn(*args, **kwargs)


def main():
    _die_with_parent()
    rank = int(os.environ.get("PMI_RANK", "0"))
    ports = os.environ.get(channel.PORTS_VARIABLE, "").split(",")
    sock = socket.create_connection(("127.0.0.1", int(ports[rank])), timeout=CONNECT_TIMEOUT_S)
    sock.settimeout(None)
    channel.send(sock, ("hello", rank, os.getpid()))
    inbox = queue.Queue()
    threading.Thread(target=_reader, args=(sock, inbox), daemon=True).start()
    _, setup = inbox.get()
    process = RankProcess(sock, setup)
    try:
        _answer(sock, ("ok", process.start(setup)))
    except BaseException as e:  # noqa: BLE001 - told to the actor, then this rank ends
        _answer(sock, ("error", e, traceback.format_exc()))
        return 1
    while True:
        message = inbox.get()
        if message[0] == "stop":
            import collectives
            collectives.shutdown()
            _answer(sock, ("ok", None))
            return 0
        try:
            outcome = ("ok", process.call(message[1], message[2]))
        except SystemExit as e:
            # hvd.elastic.run's exits (77: the hosts changed at a commit): the actor reports it.
            _answer(sock, ("exit", e.code))
            sys.stdout.flush()
            return e.code if isinstance(e.code, int) else 1
        except BaseException as e:  # noqa: BLE001 - the caller gets it with the traceback
            outcome = ("error", e, traceback.format_exc())
        _answer(sock, outcome)


if __name__ == "__main__":
    sys.exit(main())
