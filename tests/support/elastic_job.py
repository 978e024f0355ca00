"""A running ``collectivesrun`` elastic driver under test: its output read line by line with the
time each line came, a hard timeout after which its whole process group and every process
carrying the test's marker are SIGKILLed, and the check that nothing of the job is left.

Every process of the job inherits ELASTIC_TEST_MARK=<uuid> from the driver (mpirun passes the
environment on), which is how ``leftovers()`` finds them, on this machine's /proc.
"""
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
import uuid

COLLECTIVESRUN = os.path.join(os.path.dirname(sys.executable), "collectivesrun")
SCRUBBED_PREFIXES = ("COLLECTIVES_", "HOROVOD_")
MARK = "ELASTIC_TEST_MARK"


def write_hosts(path, entries):
    """The hosts file the test's discovery script prints (atomic: the script never sees half)."""
    tmp = f"{path}.tmp"
    with open(tmp, "w") as f:
        f.write("".join(f"{e}\n" for e in entries))
    os.replace(tmp, path)


def discovery_script(directory, entries):
    """(script path, hosts file path): a script that prints the hosts file."""
    hosts = os.path.join(directory, "hosts.txt")
    write_hosts(hosts, entries)
    script = os.path.join(directory, "discover.sh")
    with open(script, "w") as f:
        f.write(f"#!/bin/sh\ncat {hosts}\n")
    os.chmod(script, 0o755)
    return script, hosts


class ElasticJob:
    def __init__(self, argv, timeout, env=None):
        self.mark = uuid.uuid4().hex
        full_env = {k: v for k, v in os.environ.items() if not k.startswith(SCRUBBED_PREFIXES)}
        full_env.update({"PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1", "TF_CPP_MIN_LOG_LEVEL": "2",
                         MARK: self.mark})
        here = os.path.dirname(os.path.abspath(__file__))
        full_env["PYTHONPATH"] = os.pathsep.join(filter(None, [here, full_env.get("PYTHONPATH")]))
        full_env.update(env or {})
        self.argv = [COLLECTIVESRUN] + [str(a) for a in argv]
        self.start = time.monotonic()
        self.deadline = self.start + timeout
        self.lines = {"stdout": [], "stderr": []}
        self.lock = threading.Lock()
        self.proc = subprocess.Popen(self.argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=full_env,
                                     start_new_session=True)
        self.readers = [threading.Thread(target=self._read, args=(self.proc.stdout, "stdout"), daemon=True),
                        threading.Thread(target=self._read, args=(self.proc.stderr, "stderr"), daemon=True)]
        for t in self.readers:
            t.start()

    def _read(self, stream, name):
        for raw in iter(stream.readline, b""):
            with self.lock:
                self.lines[name].append((time.monotonic() - self.start, raw.decode(errors="replace").rstrip("\n")))

    def text(self, name="stderr"):
        with self.lock:
            return "\n".join(line for _, line in self.lines[name])

    def describe(self):
        with self.lock:
            out = "\n".join(f"{t:7.2f} {line}" for t, line in self.lines["stdout"])
            err = "\n".join(f"{t:7.2f} {line}" for t, line in self.lines["stderr"])
        return f"{' '.join(self.argv)}\nexit {self.proc.returncode}\n--- stdout ---\n{out}\n--- stderr ---\n{err}"

    def kill_all(self):
        """SIGKILL the driver and everything of the job; a driver killed cannot remove its
        commit directory, so that is removed here."""
        dirs = commit_dirs(self.mark)
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        for pid in leftovers(self.mark):
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        for d in dirs:
            shutil.rmtree(d, ignore_errors=True)

    def fail(self, why):
        self.kill_all()
        self.proc.wait()
        for t in self.readers:
            t.join(5)
        raise AssertionError(f"{why}\n{self.describe()}")

    def wait_for(self, pattern, stream="stderr", timeout=None):
        """The first (time, line) of ``stream`` matching ``pattern``; fails the test at the deadline."""
        rx = re.compile(pattern)
        end = self.deadline if timeout is None else min(self.deadline, time.monotonic() + timeout)
        while True:
            with self.lock:
                for t, line in self.lines[stream]:
                    if rx.search(line):
                        return t, line
            if self.proc.poll() is not None and all(not t.is_alive() for t in self.readers):
                self.fail(f"the driver exited before printing /{pattern}/")
            if time.monotonic() > end:
                self.fail(f"no /{pattern}/ on {stream} in time")
            time.sleep(0.05)

    def finish(self):
        """Wait for the driver's exit (hard deadline); returns its exit status."""
        try:
            self.proc.wait(timeout=max(0.1, self.deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            self.fail("the driver did not finish before the test's deadline (everything killed)")
        for t in self.readers:
            t.join(10)
        return self.proc.returncode

    def driver_lines(self):
        with self.lock:
            return [line for _, line in self.lines["stderr"] if line.startswith("elastic: ")]

    def results(self):
        """Every rank's RESULT object (lines of several ranks may run together on stdout)."""
        text = self.text("stdout").replace("\n", "")
        decoder, found, at = json.JSONDecoder(), [], text.find("RESULT {")
        while at >= 0:
            obj, end = decoder.raw_decode(text, at + len("RESULT "))
            found.append(obj)
            at = text.find("RESULT {", end)
        return found

    def assert_nothing_left(self, within=10.0):
        end = time.monotonic() + within
        while leftovers(self.mark):
            if time.monotonic() > end:
                left = leftovers(self.mark)
                self.fail(f"processes of the job still running {within:g} s after the driver ended: {left}")
            time.sleep(0.2)


def leftovers(mark):
    """Pids of this machine's processes whose environment carries ``mark`` (not this one)."""
    needle = f"{MARK}={mark}".encode()
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == os.getpid():
            continue
        try:
            with open(f"/proc/{name}/environ", "rb") as f:
                if needle in f.read().split(b"\0"):
                    found.append(int(name))
        except OSError:
            continue
    return found


def commit_dirs(mark):
    """The COLLECTIVES_ELASTIC_COMMIT_DIR of the job's running ranks."""
    found = set()
    for pid in leftovers(mark):
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                for entry in f.read().split(b"\0"):
                    if entry.startswith(b"COLLECTIVES_ELASTIC_COMMIT_DIR="):
                        found.add(entry.split(b"=", 1)[1].decode())
        except OSError:
            continue
    return sorted(found)
