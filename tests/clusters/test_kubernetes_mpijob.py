"""The launch Kubeflow's mpi-operator performs for an MPIJob with ``mpiImplementation: MPICH``,
reproduced on simulated hosts (tests/support/simpods.py): a launcher pod and two worker pods, each
a network namespace with the pod's hostname, names resolved through each pod's own /etc/hosts as
cluster DNS would resolve them, the job's key pair at /root/.ssh, a real OpenSSH sshd on every
worker (examples/kubernetes/ssh/), and /etc/mpi/hostfile plus HYDRA_HOST_FILE in the launcher.

The launcher pod runs what examples/kubernetes/mpijob-cpu.yaml has it run: ``collectivesrun python
train.py`` with no -np and no hosts, and
  * the job runs one rank per slot of the operator's hostfile (2 workers x 2 slots), with the
    topology Horovod defines and collectives equal to numpy references
    (tests/multihost/workers/multihost_worker.py);
  * plain ``mpirun -n 4 python train.py`` (the operator's own examples) starts the same ranks;
  * a worker pod that dies mid-job (every process in it killed) ends the job within 20 s with one
    line naming the pod, and nothing of the job is left in any pod;
  * a worker pod whose sshd does not answer when the launcher starts stops the launch with one
    line naming it, before any rank starts.

Needs root, network namespaces and OpenSSH's sshd (Debian's openssh-server; scripts/setup_env.sh
test installs it as root); elsewhere every test here skips, saying why. Every launch has a hard
timeout after which every process in every pod is killed. 45-60 s on a busy 2-core machine.
"""
import re
import sys
import threading
import time

import pytest

import simpods
from mpi_launch import assert_all_ranks_passed, worker_path

REASON = simpods.unavailable_reason()
pytestmark = pytest.mark.skipif(REASON is not None, reason=f"simulated MPIJob pods: {REASON}")

JOB = "pi"
WORKERS, SLOTS = 2, 2


@pytest.fixture(scope="module")
def pods():
    with simpods.SimPods(job=JOB, workers=WORKERS, slots=SLOTS) as made:
        yield made


@pytest.fixture(autouse=True)
def clean_pods(pods):
    """Each test starts with every pod up and its sshd serving, and must leave nothing behind."""
    yield
    left = {p: pids for p, pids in pods.processes().items() if pids}
    pods.restore()
    assert not left, f"processes left in the pods after the test: {left}"


def test_the_operator_launch_runs_one_rank_per_slot(pods):
    placement = ",".join(f"{w}:{SLOTS}" for w in pods.workers)
    run = pods.run_launcher(["collectivesrun", "python", worker_path("multihost_worker.py"), placement], timeout=120)
    assert run.returncode == 0, run.describe()
    assert_all_ranks_passed(run, WORKERS * SLOTS, min_cases=4)
    seen = dict(re.findall(r"\[rank (\d+)\] host=(\S+)", run.stdout))
    assert sorted(seen) == [str(r) for r in range(WORKERS * SLOTS)], run.describe()
    assert {seen[str(r)] for r in range(SLOTS)} == {pods.workers[0]}, run.describe()
    assert not run.stderr.strip(), f"the launch printed on stderr:\n{run.describe()}"


def test_plain_mpirun_reads_the_operators_hostfile_too(pods):
    """The operator's own examples run `mpirun -n N prog`: MPICH's mpirun takes the hosts from
    HYDRA_HOST_FILE, and its proxies reach the launcher by its bare hostname (the workers' DNS
    search list), so our ranks start there without collectivesrun as well."""
    placement = ",".join(f"{w}:{SLOTS}" for w in pods.workers)
    run = pods.run_launcher(["mpirun", "-n", WORKERS * SLOTS, "python", worker_path("multihost_worker.py"), placement],
                            timeout=120)
    assert run.returncode == 0, run.describe()
    assert_all_ranks_passed(run, WORKERS * SLOTS, min_cases=4)


def test_a_dead_worker_pod_is_named(pods):
    proc = pods.popen_launcher(["collectivesrun", "python", worker_path("allreduce_loop_worker.py"), 600])
    lines = {"out": [], "err": []}
    readers = [threading.Thread(target=lambda s=s, k=k: lines[k].extend(s), daemon=True)
               for s, k in ((proc.stdout, "out"), (proc.stderr, "err"))]
    for t in readers:
        t.start()

    def describe():
        return (f"exit code {proc.returncode}\n--- stdout ---\n{''.join(lines['out'])}\n--- stderr ---\n"
                f"{''.join(lines['err'])}")

    def fail(why):
        pods.kill_jobs(proc)
        for t in readers:
            t.join(5)
        raise AssertionError(f"{why}\n{describe()}")

    deadline = time.monotonic() + 120
    while True:  # every rank has made progress
        steps = {int(r) for r in re.findall(r"\[rank (\d+) host \S+\] step \d+", "".join(lines["out"]))}
        if len(steps) == WORKERS * SLOTS:
            break
        if proc.poll() is not None or time.monotonic() > deadline:
            fail("the job did not train on every rank")
        time.sleep(0.2)
    dead = pods.workers[1]
    pods.crash(dead)
    died_at = time.monotonic()
    try:
        proc.wait(timeout=20)
    except Exception:  # noqa: BLE001 - subprocess.TimeoutExpired
        fail(f"collectivesrun still running 20 s after pod {dead} died")
    ended = time.monotonic() - died_at
    for t in readers:
        t.join(10)
    assert proc.returncode != 0, describe()
    err = [line.rstrip("\n") for line in lines["err"] if line.strip()]
    ours = [line for line in err if line.startswith("collectivesrun: error:")]
    assert ours and ours == [err[-1]], f"expected one collectivesrun line, the last on stderr:\n{describe()}"
    ranks = ", ".join(str(r) for r in range(SLOTS, 2 * SLOTS))
    assert ours[0].startswith(f"collectivesrun: error: lost host '{pods.fqdn(dead)}' (pod {dead}, ranks {ranks}): "), \
        ours[0]
    print(f"collectivesrun ended the job {ended:.1f} s after pod {dead} died:\n{ours[0]}", file=sys.stderr)
    end = time.monotonic() + 10
    while any(pods.processes().values()) and time.monotonic() < end:
        time.sleep(0.2)
    left = {p: pids for p, pids in pods.processes().items() if pids}
    assert not left, f"processes left in the pods: {left}\n{describe()}"


def test_a_worker_pod_not_serving_ssh_stops_the_launch(pods, tmp_path):
    """A worker whose sshd is not up when the launcher starts (no launcherCreationPolicy:
    WaitForWorkersReady, or a broken image): one line naming it, exit 1, no rank started."""
    down = pods.workers[0]
    pods.crash(down)
    marker = tmp_path / "started"
    run = pods.run_launcher(["collectivesrun", "python", "-c", f"open({str(marker)!r}, 'w').close()"], timeout=60)
    lines = [line for line in run.stderr.splitlines() if line.strip()]
    assert run.returncode == 1 and len(lines) == 1, run.describe()
    assert lines[0].startswith(f"collectivesrun: error: cannot reach host '{pods.fqdn(down)}' over ssh: "), lines[0]
    assert not marker.exists(), "a rank started although a worker pod was down"
    print(lines[0], file=sys.stderr)
