"""Every claim across machines, on simulated hosts (tests/support/simhosts.py): three network namespaces
with their own addresses, hostnames and sshd, real TCP between them over links that can be cut,
and UCX kept to TCP so that the ranks' traffic crosses those links.

Jobs start with ``collectivesrun`` on hosta, as a user logged in there would, with uneven slots
(2+1+1) unless said otherwise:
  * topology: host, local_rank/local_size/cross_rank/cross_size and is_homogeneous() as Horovod
    defines them, for three placements (one from --hostfile), and a process set with a member on
    every host;
  * every op and dtype against numpy references (tests/engine/workers/ops_worker.py's families);
  * process sets whose members sit on different hosts (tests/engine/workers/process_set_worker.py);
  * torch and Keras DistributedOptimizer equal to single-process training
    (examples/mixed_torch_tf.py --check, 2+1 ranks on two hosts);
  * collectivesrun with an unknown host, an unreachable host (link cut) and a host refusing ssh:
    one line naming the host, exit 1, and nothing started on any host;
  * the helper itself: cut/heal, shaping, crash, and cleanup after a killed or terminated run.

Needs root and network namespaces (CI has both); elsewhere every test here skips, saying why.
Every launch has a hard timeout after which its process group and every job on every host are
killed; after each test no process may be left on any host.
"""
import os
import re
import signal
import subprocess
import sys
import tempfile
import time

import pytest

import simhosts
from mpi_launch import SUPPORT, assert_all_ranks_passed, worker_path

REASON = simhosts.unavailable_reason()
pytestmark = pytest.mark.skipif(REASON is not None, reason=f"multi-host tests need simulated hosts: {REASON}")

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PY = sys.executable
HOSTS = ["hosta", "hostb", "hostc"]
UNEVEN = "hosta:2,hostb:1,hostc:1"


@pytest.fixture(scope="module")
def sim():
    with simhosts.SimHosts(HOSTS) as hosts:
        yield hosts


@pytest.fixture(autouse=True)
def clean_hosts(sim):
    """Each test starts with every host up, unshaped and accepting ssh, and must leave no
    process behind on any host (what it left is killed, and the test fails)."""
    yield
    left = {h: pids for h, pids in sim.processes().items() if pids}
    sim.kill_everything()
    for host in HOSTS:
        sim.heal(host)
        sim.unshape(host)
        sim.refuse(host, False)
        if host not in sim.sshd:
            sim.boot(host)
    assert not left, f"processes left on the hosts after the test: {left}"


def collectivesrun(sim, *args, timeout, env=None):
    """``python -m collectives.run ARGS`` on hosta with a hard timeout."""
    return sim.run("hosta", [PY, "-m", "collectives.run", *map(str, args)], timeout=timeout, env=env)


# ----------------------------------------------------------------- topology and ops

@pytest.mark.parametrize("placement", [UNEVEN, "hostb:1,hosta:2,hostc:1", "hostfile:hosta slots=2\nhostb slots=2"])
def test_topology_as_horovod_defines_it(sim, placement, tmp_path):
    if placement.startswith("hostfile:"):
        hostfile = tmp_path / "hosts"
        hostfile.write_text(placement[len("hostfile:"):] + "\n")
        where = ["--hostfile", hostfile]
        expected = "hosta:2,hostb:2"
    else:
        where = ["-H", placement]
        expected = placement
    np_ = sum(int(entry.split(":")[1]) for entry in expected.split(","))
    run = collectivesrun(sim, "-np", np_, *where, PY, worker_path("multihost_worker.py"), expected, timeout=90)
    assert run.returncode == 0, run.describe()
    assert_all_ranks_passed(run, np_, min_cases=4)
    hosts_seen = dict(re.findall(r"\[rank (\d+)\] host=(\S+)", run.stdout))
    assert len(set(hosts_seen.values())) == len(expected.split(",")), run.describe()


def test_every_op_and_dtype_across_hosts(sim):
    families = ["allreduce", "shapes", "broadcast", "allgather", "alltoall", "reducescatter", "grouped", "objects"]
    before = {h: sim.link_bytes(h) for h in HOSTS}
    run = collectivesrun(sim, "-np", 4, "-H", UNEVEN, PY, worker_path("ops_worker.py"), *families, timeout=240)
    assert run.returncode == 0, run.describe()
    assert_all_ranks_passed(run, 4, min_cases=100)
    moved = {h: sim.link_bytes(h) - before[h] for h in HOSTS}
    print("bytes over each host's link:", moved)
    assert all(n > 1 << 20 for n in moved.values()), f"the ranks' data did not cross the links: {moved}"


def test_process_sets_spanning_hosts(sim):
    # At 2+1+1 the worker's even ranks {0, 2} sit on hosta and hostb, its odd ranks {1, 3} on
    # hosta and hostc, and its static set {0, 1} on hosta alone.
    run = collectivesrun(sim, "-np", 4, "-H", UNEVEN, PY, worker_path("process_set_worker.py"), timeout=120)
    assert run.returncode == 0, run.describe()
    assert_all_ranks_passed(run, 4, min_cases=5)


def test_torch_and_keras_training_match_one_process(sim):
    pytest.importorskip("torch")
    pytest.importorskip("tensorflow")
    # 2+1 on two hosts: three processes importing torch, TensorFlow and Keras are most of the
    # test's time on a 2-core machine.
    run = collectivesrun(sim, "-np", 3, "-H", "hosta:2,hostb:1", PY,
                         os.path.join(ROOT, "examples", "mixed_torch_tf.py"), "--check", "--steps", "8", timeout=300)
    out = run.stdout
    assert run.returncode == 0, run.describe()
    assert "training a torch and a Keras model on 3 ranks" in out, run.describe()
    assert "torch model matches single-process training: True" in out, run.describe()
    assert "keras model matches single-process training: True" in out, run.describe()


# ----------------------------------------------------------------- collectivesrun's checks

def assert_refused_before_start(sim, run, marker, *needles):
    """One line on stderr naming the host, exit 1, and no rank started anywhere."""
    lines = [line for line in run.stderr.splitlines() if line.strip()]
    assert run.returncode == 1 and len(lines) == 1, run.describe()
    assert lines[0].startswith("collectivesrun: error: "), run.describe()
    for needle in needles:
        assert needle in lines[0], f"{needle!r} not in the line:\n{run.describe()}"
    assert not os.path.exists(marker), "a rank started although a host was bad"
    assert not any(sim.processes().values()), sim.processes()


def started_marker(tmp_path):
    """A program that would leave a file behind if any rank started."""
    marker = tmp_path / "started"
    return marker, [PY, "-c", f"open({str(marker)!r}, 'w').close()"]


def test_unknown_host_is_named(sim, tmp_path):
    marker, program = started_marker(tmp_path)
    run = collectivesrun(sim, "-np", 3, "-H", "hosta:2,hostq:1", *program, timeout=60)
    assert_refused_before_start(sim, run, marker, "cannot resolve host 'hostq'")


def test_unreachable_host_is_named(sim, tmp_path):
    marker, program = started_marker(tmp_path)
    hostfile = tmp_path / "hosts"
    hostfile.write_text("hosta slots=2\nhostb slots=1\nhostc slots=1\n")
    sim.cut("hostb")
    run = collectivesrun(sim, "-np", 4, "--start-timeout", 2, "--hostfile", hostfile, *program, timeout=60)
    assert_refused_before_start(sim, run, marker, "cannot reach host 'hostb' over ssh", "timed out")
    assert run.elapsed_s < 15, run.describe()  # the start timeout, not TCP's minutes


def test_host_refusing_ssh_is_named(sim, tmp_path):
    marker, program = started_marker(tmp_path)
    sim.refuse("hostc")
    run = collectivesrun(sim, "-np", 4, "-H", UNEVEN, *program, timeout=60)
    assert_refused_before_start(sim, run, marker, "host 'hostc' refused the ssh login", "Permission denied",
                                "without a password prompt")


def test_every_bad_host_is_named_in_one_line(sim, tmp_path):
    marker, program = started_marker(tmp_path)
    sim.refuse("hostb")
    sim.cut("hostc")
    run = collectivesrun(sim, "-np", 4, "--start-timeout", 2, "-H", UNEVEN, *program, timeout=60)
    assert_refused_before_start(sim, run, marker, "'hostb' refused", "cannot reach host 'hostc'")


# ----------------------------------------------------------------- the helper's own verbs

def ssh(sim, host, command, timeout=30, connect_timeout=3):
    return sim.run("hosta", ["ssh", "-o", f"ConnectTimeout={connect_timeout}", host, command], timeout=timeout)


def test_ssh_runs_on_the_host_and_cut_heal(sim):
    run = ssh(sim, "hostb", "hostname; echo err >&2; exit 7")
    assert (run.returncode, run.stdout, run.stderr) == (7, "hostb\n", "err\n"), run.describe()
    sim.cut("hostb")
    run = ssh(sim, "hostb", "true")
    assert run.returncode == 255 and "connect to host hostb port 22: Connection timed out" in run.stderr, \
        run.describe()
    sim.heal("hostb")
    run = ssh(sim, "hostb", "hostname")
    assert (run.returncode, run.stdout) == (0, "hostb\n"), run.describe()


def test_crash_kills_everything_on_the_host(sim):
    session = sim.popen("hosta", ["ssh", "hostc", "sleep 300"])
    deadline = time.monotonic() + 20
    while not any("sleep" in _cmdline(p) for p in sim.processes()["hostc"]):
        assert time.monotonic() < deadline, "the remote sleep never started"
        time.sleep(0.05)
    sim.crash("hostc")
    try:
        _, err = session.communicate(timeout=20)
    except subprocess.TimeoutExpired:
        sim.kill_everything(session)
        raise AssertionError("the ssh session outlived its host's crash")
    assert session.returncode == 255 and "closed by remote host" in err, err
    assert sim.processes()["hostc"] == []
    assert ssh(sim, "hostc", "true", connect_timeout=2).returncode == 255  # nothing answers until it boots
    sim.boot("hostc")
    assert ssh(sim, "hostc", "hostname").stdout == "hostc\n"


def test_a_launch_past_its_timeout_leaves_nothing_behind(sim):
    # hostb's sleep runs in a session of its own there, outside the launch's process group.
    with pytest.raises(AssertionError, match="timed out after 2 s"):
        sim.run("hosta", ["ssh", "hostb", "sleep 300 & sleep 300"], timeout=2)
    assert not any(sim.processes().values()), sim.processes()


def _cmdline(pid):
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode()
    except OSError:
        return ""


RECEIVER = """
import socket, sys, time
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1); s.bind(("0.0.0.0", 5001)); s.listen()
print("listening", flush=True)
c, _ = s.accept(); n = 0
while n < int(sys.argv[1]):
    d = c.recv(1 << 20)
    if not d: break
    n += len(d)
c.sendall(b"k")
"""
SENDER = """
import socket, sys, time
c = socket.create_connection(("hostb", 5001), timeout=30); data = bytes(1 << 20); t = time.monotonic()
for _ in range(int(sys.argv[1]) >> 20): c.sendall(data)
c.recv(1); print(time.monotonic() - t)
"""


def test_shaped_egress_limits_the_rate(sim):
    size = 4 << 20
    sim.shape("hosta", "40mbit")  # 5 MB/s: 4 MiB take at least 0.8 s less the 256 kB burst
    receiver = sim.popen("hostb", [PY, "-c", RECEIVER, size])
    try:
        assert receiver.stdout.readline().strip() == "listening"
        run = sim.run("hosta", [PY, "-c", SENDER, size], timeout=60)
        assert run.returncode == 0, run.describe()
        seconds = float(run.stdout.strip())
        assert seconds >= 0.6, f"4 MiB crossed a 40 Mbit/s link in {seconds:.2f} s"
    finally:
        sim.kill_everything(receiver)
        receiver.communicate()


def _names_with(prefix):
    out = subprocess.run(["ip", "-o", "link", "show"], capture_output=True, text=True, timeout=20).stdout
    out += subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, timeout=20).stdout
    on_disk = os.listdir(simhosts.NETNS_ETC) if os.path.isdir(simhosts.NETNS_ETC) else []
    on_disk += os.listdir(tempfile.gettempdir())  # the run directory, simhosts-<prefix>-XXXX
    return sorted(set(re.findall(rf"\b{re.escape(prefix)}[a-z0-9]+", out)) | {n for n in on_disk if prefix in n})


OWNER = """
import sys, time
sys.path.insert(0, {support!r})
import simhosts
sim = simhosts.SimHosts(["x1", "x2"])
sim.popen("x1", ["sleep", "300"])
print(sim.prefix, flush=True)
time.sleep(300)
"""


@pytest.mark.parametrize("how", ["SIGTERM", "SIGKILL"])
def test_hosts_are_removed_when_their_owner_dies(how):
    owner = subprocess.Popen([PY, "-c", OWNER.format(support=SUPPORT)],
                             stdout=subprocess.PIPE, text=True, start_new_session=True)
    try:
        prefix = owner.stdout.readline().strip()
        assert prefix and _names_with(prefix), f"the owner made nothing (prefix {prefix!r})"
        owner.send_signal(getattr(signal, how))
        owner.wait(timeout=30)
        if how == "SIGKILL":  # nothing of the owner ran: the next run removes what it left
            assert _names_with(prefix)
            simhosts.remove_leftovers()
        assert _names_with(prefix) == []
    finally:
        if owner.poll() is None:
            os.killpg(owner.pid, signal.SIGKILL)
            owner.wait()
