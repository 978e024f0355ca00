"""collectivesrun and plain srun under a real Slurm (Debian's slurm-wlm 22.05 and munge), on two
simulated hosts (tests/support/simslurm.py over simhosts.py): slurmctld in nodea, one slurmd per host,
each CPUs=2, jobs submitted from nodea as a user logged in there would.

  * ``sbatch -N 2 -n 3`` (and ``salloc``) running ``collectivesrun python worker.py`` with no -np/-H: the ranks land 2+1
    as Slurm placed the tasks, the topology is Horovod's and the collectives equal numpy's;
  * ``srun --mpi=pmi2 -N 2 -n 3 python worker.py`` with no launcher of ours: the same;
  * examples/slurm/train_cpu.sbatch itself;
  * torch and Keras training through sbatch + collectivesrun equal single-process training;
  * a node crashed mid-job: the job ends with collectivesrun's one line naming the node, and
    nothing is left running or queued; under plain srun, Slurm's own line names it.

Cost (2026-11-29, 2-core VM at load 15): the cluster starts in about 2.5 s once for the module;
the whole module took 3.5 min, 88 s of it the torch/Keras case (three processes importing torch
and TensorFlow) and 38 s the example script. Needs root and network namespaces, and installs
slurm-wlm and munge with apt-get when missing; elsewhere everything here skips, saying why.
Every command has a hard timeout; whatever a test leaves (jobs, processes) is cancelled and killed,
and the cluster and namespaces are removed after the module, whatever happened.
"""
import os
import re
import signal
import subprocess
import sys
import time

import pytest

import simhosts
import simslurm
from mpi_launch import Run, assert_all_ranks_passed, worker_path

REASON = simhosts.unavailable_reason()
pytestmark = pytest.mark.skipif(REASON is not None, reason=f"real-Slurm tests need simulated hosts: {REASON}")

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PY = sys.executable
NODES = ["nodea", "nodeb"]
PLACEMENT = "nodea:2,nodeb:1"  # what -N 2 -n 3 gives on two nodes of 2 CPUs (block distribution)


@pytest.fixture(scope="module")
def slurm():
    missing = simslurm.ensure_installed()  # apt-get install slurm-wlm munge, when missing and allowed
    if missing:
        pytest.skip(f"real-Slurm tests cannot run here: {missing}")
    with simhosts.SimHosts(NODES) as sim, simslurm.SimSlurm(sim) as cluster:
        yield cluster


@pytest.fixture(autouse=True)
def clean_cluster(slurm):
    """Each test starts with both nodes idle; it must leave no job queued and no process running."""
    yield
    queued = slurm.wait_queue_empty(timeout=60)
    left = slurm.describe_processes(slurm.job_processes())
    slurm.cancel_everything()
    slurm.restore(NODES)
    assert not queued, f"jobs left in the queue after the test: {queued}"
    assert not left, f"processes left on the nodes after the test: {left}"


def batch_script(tmp_path, *command):
    script = tmp_path / "job.sh"
    script.write_text("#!/bin/sh\nexec " + " ".join(map(str, command)) + "\n")
    script.chmod(0o755)
    return script


def sbatch(slurm, tmp_path, *command, timeout, nodes=2, tasks=3):
    """``sbatch --wait -N nodes -n tasks`` of a script running ``command``; a Run of its output files."""
    script = batch_script(tmp_path, *command)
    out, err = tmp_path / "job.out", tmp_path / "job.err"
    run = slurm.run("nodea", ["sbatch", "--wait", "-N", nodes, "-n", tasks, "-o", out, "-e", err, script],
                    timeout=timeout)
    return Run(run.returncode, _read(out), _read(err) + run.stderr)


def _read(path):
    try:
        return path.read_text()
    except OSError:
        return ""


@pytest.mark.parametrize("submit", ["sbatch", "salloc"])
def test_collectivesrun_takes_the_allocation(slurm, tmp_path, submit):
    command = [PY, "-m", "collectives.run", PY, worker_path("multihost_worker.py"), PLACEMENT]
    if submit == "sbatch":
        run = sbatch(slurm, tmp_path, *command, timeout=120)
    else:  # collectivesrun in the allocation's shell on nodea (salloc runs the command there)
        run = slurm.run("nodea", ["salloc", "-N", 2, "-n", 3, *command], timeout=120)
    assert run.returncode == 0, run.describe() + slurm.logs()
    assert_all_ranks_passed(run, 3, min_cases=4)
    hosts_seen = dict(re.findall(r"\[rank (\d+)\] host=(\S+)", run.stdout))
    assert hosts_seen == {"0": "nodea", "1": "nodea", "2": "nodeb"}, run.describe()


def test_srun_pmi2_needs_no_launcher(slurm):
    run = slurm.run("nodea", ["srun", "--mpi=pmi2", "-N", 2, "-n", 3, PY, worker_path("multihost_worker.py"),
                              PLACEMENT], timeout=120)
    assert run.returncode == 0, run.describe() + slurm.logs()
    assert_all_ranks_passed(run, 3, min_cases=4)
    assert "COLLECTIVESRUN_JOB_ID" not in run.stdout


def test_collectivesrun_under_srun_refuses_to_start_the_job_per_task(slurm, tmp_path):
    marker = tmp_path / "started"
    run = slurm.run("nodea", ["srun", "-N", 2, "-n", 2, PY, "-m", "collectives.run", PY, "-c",
                              f"open({str(marker)!r}, 'w').close()"], timeout=60)
    lines = [line for line in run.stderr.splitlines() if line.startswith("collectivesrun: error: ")]
    assert run.returncode != 0 and len(lines) == 2, run.describe()
    assert all("is running in each of the 2 tasks of an srun step" in line for line in lines), run.describe()
    assert not marker.exists(), "a rank started"


def test_an_allocation_that_is_gone_is_one_line(slurm, tmp_path):
    # The environment of an allocation that has ended (job 4242 never existed here): srun cannot
    # create the proxies' step, and MPICH's launcher alone would wait forever.
    marker = tmp_path / "started"
    env = {"SLURM_JOB_ID": "4242", "SLURM_JOB_NODELIST": "nodea,nodeb", "SLURM_TASKS_PER_NODE": "2,1"}
    run = slurm.run("nodea", [PY, "-m", "collectives.run", PY, "-c", f"open({str(marker)!r}, 'w').close()"],
                    env=env, timeout=60)
    lines = [line for line in run.stderr.splitlines() if line.startswith("collectivesrun: ")]
    assert run.returncode != 0 and len(lines) == 1, run.describe()
    assert lines[0].startswith("collectivesrun: error: Slurm could not start the job's step (srun: "), lines[0]
    assert not marker.exists(), "a rank started"
    print(run.stderr)


def test_the_cpu_example_sbatch_script_runs(slurm, tmp_path):
    pytest.importorskip("torch")
    script = os.path.join(ROOT, "examples", "slurm", "train_cpu.sbatch")
    out = tmp_path / "example.out"
    # Its #SBATCH lines ask for 2 nodes x 4 tasks of 2 CPUs; the command line overrides them to fit
    # the simulated nodes, and the arguments after the script go to the training script.
    run = slurm.run("nodea", ["sbatch", "--wait", "-N", 2, "--ntasks-per-node", 1, "--cpus-per-task", 1,
                              "-D", ROOT, "-o", out, script, "--epochs", 1, "--train-size", 512],
                    env={"COLLECTIVES_VENV": sys.prefix}, timeout=180)
    text = _read(out)
    assert run.returncode == 0, run.describe() + text
    assert re.search(r"epoch 1: train loss \S+ .* accuracy \S+% .*2 ranks\)", text), text


def test_torch_and_keras_training_match_one_process(slurm, tmp_path):
    pytest.importorskip("torch")
    pytest.importorskip("tensorflow")
    run = sbatch(slurm, tmp_path, PY, "-m", "collectives.run", PY, os.path.join(ROOT, "examples", "mixed_torch_tf.py"),
                 "--check", "--steps", "8", timeout=300)
    assert run.returncode == 0, run.describe()
    assert "training a torch and a Keras model on 3 ranks" in run.stdout, run.describe()
    assert "torch model matches single-process training: True" in run.stdout, run.describe()
    assert "keras model matches single-process training: True" in run.stdout, run.describe()


def crash_mid_job(slurm, argv, out, err, ranks_out=None):
    """Start ``argv`` on nodea in the background (its output to ``out`` and ``err``), wait until
    all 3 ranks of allreduce_loop_worker.py print steps (to ``ranks_out``, default ``out``), crash
    nodeb, and wait (60 s at most) for the command to end. Returns (exit status, seconds from the
    crash to the end)."""
    ranks_out = ranks_out or out
    with open(out, "w") as out_file, open(err, "w") as err_file:
        job = subprocess.Popen(slurm.sim.command_in("nodea", argv), env=slurm.env(), stdout=out_file,
                               stderr=err_file, stdin=subprocess.DEVNULL, start_new_session=True)
    try:
        deadline = time.monotonic() + 120
        while len(set(re.findall(r"\[rank (\d+) host \S+\] step", _read(ranks_out)))) < 3:
            assert job.poll() is None and time.monotonic() < deadline, \
                f"the job did not train on every rank\n{_read(ranks_out)}\n{_read(err)}\n{slurm.logs()}"
            time.sleep(0.2)
        slurm.sim.crash("nodeb")
        crashed_at = time.monotonic()
        try:
            job.wait(timeout=60)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"{argv[0]} still running 60 s after the crash\n{_read(out)}\n{_read(err)}") from None
        return job.returncode, time.monotonic() - crashed_at
    finally:
        if job.poll() is None:
            os.killpg(job.pid, signal.SIGKILL)
            job.wait()
            slurm.cancel_everything()


def test_a_lost_node_ends_the_job_naming_it(slurm, tmp_path):
    script = batch_script(tmp_path, PY, "-m", "collectives.run", PY, worker_path("allreduce_loop_worker.py"), 600)
    out, err = tmp_path / "job.out", tmp_path / "job.err"
    code, ended = crash_mid_job(slurm, ["sbatch", "--wait", "-N", 2, "-n", 3, "-o", out, "-e", err, script],
                                tmp_path / "sbatch.out", tmp_path / "sbatch.err", ranks_out=out)
    print(f"the job ended {ended:.1f} s after the crash; its stderr:\n{_read(err)}")
    lines = [line for line in _read(err).splitlines() if line.startswith("collectivesrun: ")]
    assert code != 0, _read(err)
    assert len(lines) == 1, _read(err)
    assert lines[0].startswith("collectivesrun: error: lost host 'nodeb' (rank 2): "), lines[0]
    assert "does not answer on its slurmd port" in lines[0], lines[0]


def test_a_lost_node_under_plain_srun_is_named_by_slurm(slurm, tmp_path):
    # No launcher of ours: Slurm ends the step once it declares the node down (SlurmdTimeout,
    # 10 s here; 300 s by default), and srun names it.
    out, err = tmp_path / "srun.out", tmp_path / "srun.err"
    code, ended = crash_mid_job(slurm, ["srun", "--mpi=pmi2", "-N", 2, "-n", 3, PY,
                                        worker_path("allreduce_loop_worker.py"), 600], out, err)
    print(f"srun ended {ended:.1f} s after the crash; its stderr:\n{_read(err)}")
    assert code != 0, _read(err)
    assert "srun: error: Node failure on nodeb" in _read(err), _read(err)
