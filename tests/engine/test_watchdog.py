"""The watchdog on one machine: a backend call that never returns ends the job (csrc/monitor/watchdog.cc),
and collectivesrun, which now runs the MPI launcher as its child (collectives/launcher/supervise.py),
ends the job and says what happened.

What can be provoked honestly on one host: a rank stops itself with SIGSTOP (engine thread and
all) in the middle of training, as a hung or debugged process would; the other ranks' engine
threads are then stuck in a blocking MPI call that no error will ever end. With the stall
shutdown time at 3 s:
  * under mpirun: every other rank logs the watchdog's report naming the call and the stopped
    rank with its host, raises StallTimeoutError in synchronize() (numpy), in a synchronous
    allreduce (whose waiting caller runs the cycles itself: csrc/core/engine_inline.cc) or in a torch
    DistributedOptimizer step, and is ended by the watchdog with exit status 75 (the workers
    linger after the error, so nothing else could end them; the first to end reports its
    status); nothing is left running;
  * under collectivesrun: one last line names the rank that did not report and the job exits 75;
  * 0 turns the watchdog off: the job is still stuck 8 s later (the limit's meaning).
And what running the launcher as a child must keep: Ctrl-C at collectivesrun ends a blocked job,
and a job's exit status is its own.
(Multi-host failures: tests/multihost/test_multihost_failures.py.)
"""
import os
import re
import signal
import socket
import subprocess
import sys
import time
import uuid

import pytest

from mpi_launch import SUPPORT, Run, run_workers, worker_path

LIMIT_S = 3
WATCHDOG_EXIT = 75
HOST = socket.gethostname()
WORKER = worker_path("watchdog_worker.py")
COLLECTIVESRUN = [sys.executable, "-m", "collectives.run"]


def job_processes(token):
    """Pids of this machine whose environment carries the test's token (the job's processes)."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                if f"WATCHDOG_TEST_TOKEN={token}".encode() in f.read().split(b"\0"):
                    found.append(int(pid))
        except OSError:
            pass
    return found


def assert_nothing_left(token, what):
    """No process of the job left (killed ones may take a moment to go)."""
    deadline = time.monotonic() + 10
    while job_processes(token) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not job_processes(token), f"processes of the job left: {job_processes(token)}\n{what}"


def launch(argv, token, timeout, env=None):
    """A command with a hard timeout (its whole session is killed past it); Run plus seconds."""
    full_env = {k: v for k, v in os.environ.items() if not k.startswith(("COLLECTIVES_", "HOROVOD_"))}
    full_env.update(OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1", WATCHDOG_TEST_TOKEN=token,
                    PYTHONPATH=os.pathsep.join(filter(None, [SUPPORT, os.environ.get("PYTHONPATH")])))
    full_env.update(env or {})
    start = time.monotonic()
    proc = subprocess.Popen(list(map(str, argv)), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=full_env, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        for pid in job_processes(token):
            os.kill(pid, signal.SIGKILL)
        out, err = proc.communicate()
        raise AssertionError(f"{argv} timed out after {timeout} s\n--- stdout ---\n{out}\n--- stderr ---\n{err}")
    return Run(proc.returncode, out, err), time.monotonic() - start


# What a request made after the watchdog stopped the engine says before the stall's report.
STOPPED_EARLIER = "collectives stopped earlier in this process: "


def stalled_errors(run):
    """{rank: (phase, message)} of the workers' error lines: a StallTimeoutError, or (torch mode) a
    ShutdownError from a gradient hook that submitted after the watchdog had stopped the engine,
    whose message is the same stall report behind STOPPED_EARLIER (seen in CI when backward
    outlasted the 3 s limit on a loaded machine). Its phase is returned as "backward:stopped"."""
    found = {}
    for r, phase, kind, msg in re.findall(
            r"\[rank (\d+) host \S+\] error in (\w+) after \S+: (StallTimeoutError|ShutdownError): (.*)", run.stdout):
        if kind == "ShutdownError":
            if phase != "backward" or not msg.startswith(STOPPED_EARLIER):
                continue  # not the stall: the assertions below then fail for this rank
            phase, msg = "backward:stopped", msg[len(STOPPED_EARLIER):]
        found[int(r)] = (phase, msg)
    return found


def assert_stopped_rank_reported(run, mode):
    """Ranks 0 and 2 report the stall naming rank 1 and its host; rank 1 (stopped) says nothing."""
    assert "[rank 1 host" in run.stdout and "stopping itself" in run.stdout, run.describe()
    errors = stalled_errors(run)
    # Every survivor reports: its watchdog's FATAL line always (written before anything else), and
    # the StallTimeoutError its Python thread raises unless the process is ended first (under
    # heavy load, mpirun can kill a rank once another rank has exited 75). At least one of the two
    # errors must reach Python.
    fatal = {int(r) for r in re.findall(r"\[collectives FATAL rank (\d+)\]", run.stderr)}
    assert fatal == {0, 2}, f"watchdog reports from ranks {sorted(fatal)}, expected [0, 2]\n{run.describe()}"
    assert errors and set(errors) <= {0, 2}, f"StallTimeoutError from ranks {sorted(errors)}\n{run.describe()}"
    for r, (phase, message) in errors.items():
        expected = {"sync": ["synchronize"], "verb": ["allreduce"], "torch": ["step", "backward:stopped"]}[mode]
        assert phase in expected, run.describe()
        m = re.match(r"stalled in a backend call: ((?:MPI_\w+|the negotiation's exchange).*?) has not returned after 3 s, waiting on (ranks? .*?)\. ",
                     message)
        assert m, f"rank {r}: {message}"
        peers = m.group(2)
        assert peers == f"ranks {', '.join(str(q) for q in (0, 1, 2) if q != r)} on {HOST}", (r, peers)
        assert f"exits with status {WATCHDOG_EXIT}" in message and "COLLECTIVES_STALL_SHUTDOWN_TIME_SECONDS" in message
        report = re.search(rf"\[collectives FATAL rank {r}\] (stalled in a backend call: .*)", run.stderr)
        # Compared on the head: output lines of several ranks can run together in mpirun's stream.
        assert report and report.group(1)[:100] == message[:100], f"rank {r}'s report is not its error:\n{run.describe()}"


@pytest.mark.parametrize("mode", ["sync", "verb", "torch"])
def test_a_stopped_rank_ends_the_job_under_mpirun(mode):
    if mode == "torch":
        pytest.importorskip("torch")
    token = uuid.uuid4().hex
    start = time.monotonic()
    run = run_workers(3, "watchdog_worker.py", mode, 120, "--stop-rank", 1, "--stop-after", 10, "--linger",
                      "--report-exit", env={"COLLECTIVES_STALL_SHUTDOWN_TIME_SECONDS": str(LIMIT_S),
                                            "WATCHDOG_TEST_TOKEN": token},
                      timeout=90, expect_success=False)
    elapsed = time.monotonic() - start
    assert run.returncode != 0, run.describe()
    assert_stopped_rank_reported(run, mode)
    # The workers linger after the error: only the watchdog's exit ends them. The first rank to
    # end reports its status before mpirun learns of it and kills the others (whose statuses,
    # and mpirun's own, are then those of the kill).
    statuses = {int(r): int(code) for r, code in re.findall(r"\[rank (\d+)\] exit status (-?\d+)", run.stdout)}
    watchdog_exits = [r for r, code in statuses.items() if code == WATCHDOG_EXIT]
    assert watchdog_exits and set(watchdog_exits) <= {0, 2}, f"exit statuses {statuses}\n{run.describe()}"
    assert elapsed < 60, f"{elapsed:.1f} s\n{run.describe()}"
    assert_nothing_left(token, run.describe())


def test_a_stopped_rank_under_collectivesrun_gets_one_line():
    token = uuid.uuid4().hex
    run, elapsed = launch(COLLECTIVESRUN + ["-np", 3, "--stall-shutdown-time", LIMIT_S, sys.executable, WORKER, "sync",
                                            120, "--stop-rank", 1, "--stop-after", 10, "--linger"], token, timeout=90)
    assert run.returncode == WATCHDOG_EXIT, run.describe()
    assert_stopped_rank_reported(run, "sync")
    lines = [line for line in run.stderr.splitlines() if line.strip()]
    ours = [line for line in lines if line.startswith("collectivesrun: error:")]
    assert ours == [lines[-1]], f"expected one collectivesrun line, the last:\n{run.describe()}"
    assert re.fullmatch(rf"collectivesrun: error: the job stalled: ranks 0, 2 waited 3 s in (?:MPI_\w+|the negotiation's exchange).*; rank 1 "
                        rf"\(on {re.escape(HOST)}\) did not report it: stopped, hung or cut off \(every host answers "
                        rf"ssh\); the job was ended \(exit status {WATCHDOG_EXIT}\)", ours[0]), ours[0]
    # The job ended when the launcher saw the reports, not when the graces ran out.
    assert elapsed < 40, f"{elapsed:.1f} s\n{run.describe()}"
    assert_nothing_left(token, run.describe())


def test_zero_turns_the_watchdog_off():
    token = uuid.uuid4().hex
    with pytest.raises(AssertionError, match="timed out after 8 s") as stuck:
        launch(COLLECTIVESRUN + ["-np", 2, "--stall-shutdown-time", 0, sys.executable, WORKER, "sync", 120,
                                 "--stop-rank", 1, "--stop-after", 10], token, timeout=8)
    text = str(stuck.value)
    assert "stopping itself" in text and "stalled in a backend call" not in text, text
    assert_nothing_left(token, text)


def test_ctrl_c_at_collectivesrun_ends_a_blocked_job(tmp_path):
    """Ctrl-C in a terminal signals collectivesrun's process group; the MPI launcher runs in a
    session of its own, so collectivesrun must forward it: every rank, blocked in synchronize(),
    raises KeyboardInterrupt and the job ends."""
    token = uuid.uuid4().hex
    env = {k: v for k, v in os.environ.items() if not k.startswith(("COLLECTIVES_", "HOROVOD_"))}
    env.update(OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1", WATCHDOG_TEST_TOKEN=token,
               PYTHONPATH=os.pathsep.join(filter(None, [SUPPORT, os.environ.get("PYTHONPATH")])))
    proc = subprocess.Popen(COLLECTIVESRUN + ["-np", "2", sys.executable, worker_path("lifecycle_worker.py"),
                                              "ctrl_c", str(tmp_path)],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
                            start_new_session=True)
    try:
        deadline = time.monotonic() + 60
        while not all((tmp_path / f"pid.{r}").exists() for r in range(2)):
            assert proc.poll() is None and time.monotonic() < deadline, "ranks did not start"
            time.sleep(0.05)
        time.sleep(1.0)  # every rank is now blocked in synchronize()
        os.killpg(proc.pid, signal.SIGINT)  # collectivesrun's group: not the launcher's session
        out, _ = proc.communicate(timeout=20)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            for pid in job_processes(token):
                os.kill(pid, signal.SIGKILL)
            proc.communicate()
    for r in range(2):
        assert (tmp_path / f"interrupted.{r}").exists(), f"rank {r} did not raise KeyboardInterrupt\n{out}"
    assert proc.returncode != 0, out
    assert_nothing_left(token, out)


def test_the_exit_status_is_the_jobs_own():
    token = uuid.uuid4().hex
    run, _ = launch(COLLECTIVESRUN + ["-np", 2, sys.executable, "-c", "import sys; sys.exit(3)"], token, timeout=60)
    assert run.returncode == 3, run.describe()
    assert "collectivesrun: error" not in run.stderr, run.describe()
    # One write(2) per rank: the ranks share mpirun's stdout and PYTHONUNBUFFERED makes print() write
    # "fine" and "\n" separately, which two ranks may interleave.
    run, _ = launch(COLLECTIVESRUN + ["-np", 2, sys.executable, "-c", "import os; os.write(1, b'fine\\n')"],
                    token, timeout=60)
    assert (run.returncode, run.stdout, run.stderr.strip()) == (0, "fine\nfine\n", "")
