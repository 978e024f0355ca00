"""What the Ray tests share: Ray's processes of this venv (to show none is left), the actors Ray
still counts alive (the GCS actor table: works without the dashboard that `ray.util.state`
needs), and a hard timeout for calls that wait on Ray in this process."""
import contextlib
import os
import signal
import subprocess
import sys
import time

# Ray's daemons as their command lines name them (the raylet, the GCS, the log monitor, ...).
RAY_DAEMONS = ("raylet", "gcs_server", "log_monitor.py", "monitor.py", "dashboard", "ray::", "default_worker.py")


def ray_missing_reason():
    try:
        import ray  # noqa: F401
    except ImportError:
        return "Ray is not installed (pip install 'collectives[ray]'; scripts/setup_env.sh test installs it)"
    return None


def ray_processes():
    """'pid cmdline' of the Ray daemons and workers running from this venv's Ray, and of our rank
    processes and proxies."""
    out = subprocess.run(["ps", "-eo", "pid=,args="], capture_output=True, text=True).stdout
    found = []
    for line in out.splitlines():
        pid, _, args = line.strip().partition(" ")
        if int(pid) == os.getpid():
            continue
        ours = sys.prefix in args or "collectives.ray.rank_process" in args
        if ours and (any(d in args for d in RAY_DAEMONS) or "collectives.ray.rank_process" in args
                     or ("hydra_pmi_proxy" in args and "--launcher manual" in args)):
            found.append(line.strip())
    return found


def wait_until_no_ray_processes(timeout=30.0):
    deadline = time.monotonic() + timeout
    while ray_processes() and time.monotonic() < deadline:
        time.sleep(0.5)
    return ray_processes()


def alive_actors():
    import ray
    table = ray._private.state.actors()  # noqa: SLF001 - the GCS actor table
    return {a: info["State"] for a, info in table.items() if info["State"] != "DEAD"}


class HardTimeout(Exception):
    pass


@contextlib.contextmanager
def hard_timeout(seconds, what):
    """Raises HardTimeout in this (main) thread after ``seconds``; as a last resort (a wait that
    never returns to Python) the process dumps its stacks and exits 20 s later."""
    import faulthandler

    def expire(signum, frame):
        raise HardTimeout(f"{what} did not finish within {seconds} s")
    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    faulthandler.dump_traceback_later(seconds + 20, exit=True)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
        faulthandler.cancel_dump_traceback_later()


def alive_actor_pids():
    import ray
    return [info["Pid"] for info in ray._private.state.actors().values()  # noqa: SLF001
            if info["State"] == "ALIVE" and info.get("Pid")]


RAY_TEMP = "/tmp/ray"  # Ray's default temporary directory: a session_* folder of logs per start


def ray_sessions():
    try:
        return {d for d in os.listdir(RAY_TEMP) if d.startswith("session_")}
    except FileNotFoundError:
        return set()


def remove_new_sessions(before):
    """Removes the session folders (logs, sockets) of the Ray instances a test started."""
    import shutil
    for d in ray_sessions() - set(before):
        path = os.path.join(RAY_TEMP, d)
        if os.path.islink(path):
            os.unlink(path)
        else:
            shutil.rmtree(path, ignore_errors=True)
