"""The Ray actor behind one rank (wrapped with ``ray.remote`` by the executor).

An actor does not run the user's functions itself: the MPI world is formed by MPICH's launcher,
whose proxy (one per node, started by the node's first actor) starts the rank processes
(rank_process.py). Each actor listens on its node's loopback for the rank process of its rank
and forwards calls to it. So the actor is what Ray schedules, accounts resources to and reports
lost; the rank process is what holds the engine.
"""
import ctypes
import os
import signal
import socket
import subprocess
import sys

from . import channel
from .errors import RankExited, RayStartTimeout, WorkerLostError


def _die_with_actor():
    """preexec_fn of the proxy: SIGKILL when the actor's process dies, however it dies."""
    if sys.platform.startswith("linux"):
        ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGKILL), 0, 0, 0)  # PR_SET_PDEATHSIG


class RankActor:
    def __init__(self):
        self.server = channel.listen()
        self.conn = None
        self.proxy = None
        self.rank = None

    def info(self):
        import ray
        context = ray.get_runtime_context()
        return {"node_id": context.get_node_id(), "node_ip": ray.util.get_node_ip_address(),
                "actor_id": context.get_actor_id(), "hostname": socket.gethostname(), "pid": os.getpid(),
                "port": self.server.getsockname()[1], "gpu_ids": [str(g) for g in ray.get_gpu_ids()]}

    def start_proxy(self, argv, env):
        """Runs MPICH's proxy for this node (the command mpiexec printed for it)."""
        self.proxy = subprocess.Popen(argv, env=dict(os.environ, **env), stdin=subprocess.DEVNULL,
                                      preexec_fn=_die_with_actor)
        return self.proxy.pid

    def connect(self, rank, setup, timeout):
        """Waits for the rank process of ``rank``, hands it its set-up and returns its topology."""
        self.rank = rank
        self.server.settimeout(timeout)
        try:
            conn, _ = self.server.accept()
        except socket.timeout:
            raise RayStartTimeout(f"rank {rank}'s process did not start within {timeout:g} s (timeout_s) on "
                                  f"{socket.gethostname()}") from None
        conn.settimeout(None)
        self.conn = conn
        channel.receive(conn)  # hello
        channel.send(conn, ("setup", setup))
        return self._reply("starting the engine")

    def call(self, kind, payload, sys_path=()):
        """Runs one function in the rank process: kind "run" (fn(*args, **kwargs)) or "execute"
        (fn(executable)); returns its value or raises its exception."""
        sys.path[:0] = [p for p in sys_path if p not in sys.path]  # to unpickle what the function returns
        if self.conn is None:
            raise WorkerLostError(f"rank {self.rank}: its process is not connected", rank=self.rank)
        try:
            channel.send(self.conn, ("call", kind, payload))
        except OSError:
            self._lost("the call was sent")
        return self._reply("running a function")

    def _reply(self, doing):
        try:
            reply = channel.receive(self.conn)
        except (channel.ChannelClosed, OSError):
            self._lost(doing)
        if reply[0] == "ok":
            return reply[1]
        if reply[0] == "exit":
            raise RankExited(f"rank {self.rank} exited with status {reply[1]}", rank=self.rank, code=reply[1])
        _, error, remote_traceback = reply
        if hasattr(error, "add_note"):
            error.add_note(f"raised on rank {self.rank} ({socket.gethostname()}); its traceback:\n{remote_traceback}")
        raise error

    def _lost(self, doing):
        self.conn = None
        raise WorkerLostError(f"rank {self.rank}'s process on {socket.gethostname()} ended while {doing} (it was "
                              "killed, or another rank's failure ended the MPI world)", rank=self.rank)

    def remove_tree(self, path):
        import shutil
        shutil.rmtree(path, ignore_errors=True)
        return True

    def stop(self, timeout=10.0):
        """Asks the rank process to shut the engine down and exit; ends the proxy."""
        if self.conn is not None:
            try:
                self.conn.settimeout(timeout)
                channel.send(self.conn, ("stop",))
                channel.receive(self.conn)
            except Exception:  # noqa: BLE001 - already gone: nothing to stop
                pass
            self.conn.close()
            self.conn = None
        if self.proxy is not None:
            try:
                self.proxy.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proxy.kill()
                self.proxy.wait()
        return True
