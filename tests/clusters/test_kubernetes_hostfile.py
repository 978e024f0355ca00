"""collectivesrun in an MPIJob's launcher pod: with no -np and no hosts on its command line it takes
the hostfile that mpi-operator names in HYDRA_HOST_FILE (I_MPI_HYDRA_HOST_FILE,
OMPI_MCA_orte_default_hostfile for the other MPIs) and one rank per slot
(collectives/launcher/operator_hostfile.py). Runs on this machine alone: the hostfile names this
machine, so no ssh is involved (tests/clusters/test_kubernetes_mpijob.py runs the real thing across
simulated pods). About 5 s.
"""
import os
import socket
import subprocess
import sys

import pytest

from collectives.launcher import args as launcher_args
from collectives.launcher import host_sources, hosts, operator_hostfile, supervise

PY = sys.executable


def hostfile(tmp_path, text):
    path = tmp_path / "hostfile"
    path.write_text(text)
    return str(path)


def test_the_operators_mpich_hostfile_gives_hosts_and_ranks(tmp_path):
    path = hostfile(tmp_path, "pi-worker-0.pi.default.svc:2\npi-worker-1.pi.default.svc:2\n")
    where = host_sources.place(launcher_args.parse(["python", "train.py"]), {"HYDRA_HOST_FILE": path})
    assert where.np == 4 and where.bootstrap == host_sources.SSH
    assert where.hosts == [hosts.Host("pi-worker-0.pi.default.svc", 2), hosts.Host("pi-worker-1.pi.default.svc", 2)]


@pytest.mark.parametrize("variable", [v for v, _ in operator_hostfile.VARIABLES])
def test_each_mpis_variable_is_read(tmp_path, variable):
    path = hostfile(tmp_path, "a.svc slots=3\n" if variable.startswith("OMPI") else "a.svc:3\n")
    where = host_sources.place(launcher_args.parse(["prog"]), {variable: path})
    assert (where.hosts, where.np) == ([hosts.Host("a.svc", 3)], 3)


def test_the_command_line_wins(tmp_path):
    path = hostfile(tmp_path, "a.svc:2\nb.svc:2\n")
    where = host_sources.place(launcher_args.parse(["-np", "2", "-H", "localhost:2", "prog"]), {"HYDRA_HOST_FILE": path})
    assert (where.hosts, where.np, where.source) == ([hosts.Host("localhost", 2)], 2, "-H")
    where = host_sources.place(launcher_args.parse(["-np", "1", "prog"]), {"HYDRA_HOST_FILE": path})
    assert (len(where.hosts), where.np) == (2, 1)  # fewer ranks than slots: the file still places them


def test_lost_hosts_are_named_by_their_pod_in_the_launcher_pod():
    launcher = {"K_MPI_JOB_ROLE": "launcher"}
    assert operator_hostfile.pod_of("pi-worker-1.pi.default.svc", launcher) == "pi-worker-1"
    assert operator_hostfile.pod_of("pi-worker-1.pi-worker.ns.svc.cluster.local", launcher) == "pi-worker-1"
    assert operator_hostfile.pod_of("pi-worker-1.pi.default.svc", {}) == ""  # not in an MPIJob
    assert operator_hostfile.pod_of("hostb", launcher) == ""
    assert operator_hostfile.pod_of("node1.example.com", launcher) == ""


def test_a_closed_ssh_session_means_a_lost_host():
    """OpenSSH's line when a worker pod's sshd dies mid-session; alone it must end the job with
    the lost-host line (a surviving rank may crash first, and mpiexec then reports only that)."""
    seen = supervise.Findings()
    seen.scan("[rank 0 host pi-worker-0] step 7 t=1.0s")
    seen.scan("Connection to pi-worker-0.pi.default.svc closed.")  # a normal end of a session
    assert not seen.alarm.is_set()
    seen.scan("Connection to pi-worker-1.pi.default.svc closed by remote host.")
    assert seen.alarm.is_set() and seen.lost_proxy
    lost = supervise.HostRanks("pi-worker-1.pi.default.svc", (2, 3), False, pod="pi-worker-1")
    assert supervise.summary(seen, [lost], {lost.name: "Connection refused"}).startswith(
        "lost host 'pi-worker-1.pi.default.svc' (pod pi-worker-1, ranks 2, 3): the MPI launcher's connection")


def test_without_the_variable_np_is_still_required():
    with pytest.raises(host_sources.PlacementError, match="-np N is required"):
        host_sources.place(launcher_args.parse(["prog"]), {})


def run(env_extra, *argv):
    env = {k: v for k, v in os.environ.items() if k not in {v for v, _ in operator_hostfile.VARIABLES}}
    env.update(env_extra)
    return subprocess.run([PY, "-m", "collectives.run", *argv], env=env, capture_output=True, text=True, timeout=120,
                          stdin=subprocess.DEVNULL)


def test_collectivesrun_runs_one_rank_per_slot(tmp_path):
    path = hostfile(tmp_path, f"{socket.gethostname()}:2\n")
    proc = run({"HYDRA_HOST_FILE": path}, PY, "-c",
               # One write per rank: the ranks share the launcher's stdout, and print() writes each
               # piece separately when the output is unbuffered, so two ranks' pieces could interleave.
               "import os, collectives as hvd; hvd.init(); os.write(1, f'rank {hvd.rank()} of {hvd.size()}\\n'.encode())")
    assert proc.returncode == 0, proc.stderr
    assert sorted(proc.stdout.split("\n")[:2]) == ["rank 0 of 2", "rank 1 of 2"], proc.stdout


def test_a_missing_hostfile_is_one_line(tmp_path):
    missing = str(tmp_path / "mpi" / "hostfile")
    proc = run({"HYDRA_HOST_FILE": missing}, PY, "-c", "print('started')")
    assert proc.returncode == 1 and "started" not in proc.stdout, proc
    assert proc.stderr.strip().splitlines() == [
        f"collectivesrun: error: cannot read host file {missing}: No such file or directory "
        "(the host file named by HYDRA_HOST_FILE)"], proc.stderr
