"""Forms the MPI world among the actors without ssh: MPICH's launcher (mpiexec, hydra) runs in
the driver with ``-launcher manual``, prints the command of each host's proxy, and the first
actor of each Ray node runs that command; the proxy then starts the node's rank processes.

Hydra's locality is its proxy: the ranks of one proxy are one node to MPI (shared memory,
local_rank/local_size), so there is one hydra "host" per Ray node, named after the node's
address, holding that node's ranks.
"""
import os
import re
import subprocess
import sys
import threading
import time

from ..launcher import mpi_locator, supervise
from .errors import RayStartError, RayStartTimeout
from .placement import node_groups
from .channel import PORTS_VARIABLE

LAUNCH_PREFIX = "HYDRA_LAUNCH: "
LAUNCH_END = "HYDRA_LAUNCH_END"
CONTROL_PORT = re.compile(r"(--control-port\s+)(\S+):(\d+)")


def _die_with_driver():
    return supervise._death_signal()  # noqa: SLF001 - the same PR_SET_PDEATHSIG preexec as collectivesrun


def _pump(stream, sink):
    for line in iter(stream.readline, ""):
        sink.write(line)
        sink.flush()
    stream.close()


class World:
    """The launcher of one MPI world (one set of actors): ``launch`` starts it, ``stop`` ends it."""

    def __init__(self, driver_ip, timeout_s):
        self.driver_ip = driver_ip
        self.timeout_s = timeout_s
        self.mpiexec = None

    def mpiexec_argv(self, infos, env):
        groups = node_groups(infos)
        hosts = ",".join(f"{ip}-node{k}:{len(members)}" for k, (_, ip, members) in enumerate(groups))
        ports = ",".join(str(info["port"]) for info in infos)
        try:
            launcher = mpi_locator.locate()
        except mpi_locator.LauncherError as e:
            raise RayStartError(str(e)) from None
        if launcher.flavor != mpi_locator.HYDRA:
            raise RayStartError(f"collectives.ray forms its MPI world with MPICH's launcher (hydra); "
                                f"{launcher.describe()} is not one (set COLLECTIVES_MPIRUN to MPICH's mpiexec)")
        path = launcher.path
        argv = [path, "-launcher", "manual", "-genvnone", "-hosts", hosts, "-n", str(len(infos)),
                "-genv", PORTS_VARIABLE, ports]
        for name, value in env.items():
            argv += ["-genv", name, str(value)]
        return argv + [sys.executable, "-m", "collectives.ray.rank_process"], groups

    def _read_launch_commands(self, deadline):
        commands = []
        while True:
            if time.monotonic() > deadline:
                raise RayStartTimeout(f"MPICH's launcher printed no proxy commands within {self.timeout_s:g} s")
            line = self.mpiexec.stdout.readline()
            if not line:
                err = self.mpiexec.stderr.read()[-2000:]
                raise RayStartError(f"MPICH's launcher exited with status {self.mpiexec.wait()} before printing "
                                    f"its proxy commands: {err.strip()}")
            if line.startswith(LAUNCH_PREFIX):
                commands.append(CONTROL_PORT.sub(lambda m: f"{m.group(1)}{self.driver_ip}:{m.group(3)}",
                                                 line[len(LAUNCH_PREFIX):].strip()).split())
            elif line.strip() == LAUNCH_END:
                return commands

    def launch(self, infos, env):
        """Starts mpiexec; returns [(leader index, proxy argv)], one per node, in node order."""
        argv, groups = self.mpiexec_argv(infos, env)
        self.mpiexec = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                        stderr=subprocess.PIPE, text=True, start_new_session=True,
                                        preexec_fn=_die_with_driver())
        # A separate reader would race for the launch lines: read them first, then pump.
        try:
            commands = self._read_launch_commands(time.monotonic() + self.timeout_s)
        except BaseException:
            self.stop()
            raise
        threading.Thread(target=_pump, args=(self.mpiexec.stdout, sys.stdout), daemon=True).start()
        threading.Thread(target=_pump, args=(self.mpiexec.stderr, sys.stderr), daemon=True).start()
        if len(commands) != len(groups):
            self.stop()
            raise RayStartError(f"MPICH's launcher printed {len(commands)} proxy commands for {len(groups)} nodes")
        return [(members[0], command) for (_, _, members), command in zip(groups, commands)]

    def exit_status(self):
        return None if self.mpiexec is None else self.mpiexec.poll()

    def stop(self, grace=3.0):
        if self.mpiexec is None:
            return
        child, self.mpiexec = self.mpiexec, None
        if child.poll() is None:
            try:
                os.killpg(child.pid, 15)
                child.wait(grace)
            except subprocess.TimeoutExpired:
                os.killpg(child.pid, 9)
                child.wait()
            except ProcessLookupError:
                pass
