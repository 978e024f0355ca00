"""Slurm's compressed node lists and task counts (collectives/launcher/slurm_nodelist.py), the
allocation read from Slurm's environment (slurm_allocation.py), where collectivesrun puts the ranks
inside one (host_sources.py) and the launcher argv it builds. No daemons: cheap (under 2 s).

Our parser is held to Slurm's own ``scontrol show hostnames`` (which needs only a slurm.conf, no
controller) when Debian's slurm-client is installed; without it those cases skip, saying why.
The jobs themselves run under a real Slurm in tests/clusters/test_slurm_cluster.py.
"""
import os
import shutil

import pytest

from collectives.launcher import args as cli
from collectives.launcher import cli as runmod
from collectives.launcher import command, host_sources, hosts, mpi_locator, slurm_allocation, slurm_nodelist, supervise

LISTS = {
    "node[01-04,07]": ["node01", "node02", "node03", "node04", "node07"],
    "a[1-2],b3": ["a1", "a2", "b3"],
    "n[9-11]": ["n9", "n10", "n11"],
    "n[01-3]": ["n01", "n02", "n03"],
    "n[1-02]": ["n1", "n2"],
    "n[99-101]": ["n99", "n100", "n101"],
    "n[0001-0002]": ["n0001", "n0002"],
    "n[1-3,5],m[002-004]": ["n1", "n2", "n3", "n5", "m002", "m003", "m004"],
    "a,b[2,1]": ["a", "b2", "b1"],
    "a[1-2]b[3-4]": ["a1b3", "a1b4", "a2b3", "a2b4"],
    "n[1-2],n1": ["n1", "n2", "n1"],
    "node[1]": ["node1"],
    "n1-2": ["n1-2"],
    "a,,b": ["a", "b"],
    "single": ["single"],
}
INVALID = ["n[5-3]", "n[a-b]", "x[008-010]-ib", "n[1-2]x[1-2]y", "n[010-8]"]


@pytest.mark.parametrize("text", sorted(LISTS))
def test_node_lists_expand_as_slurm_does(text):
    assert slurm_nodelist.expand_nodelist(text) == LISTS[text]


@pytest.mark.parametrize("text", INVALID + ["n[1-2", "n]1", "n[[1]]"])
def test_invalid_node_lists_raise(text):
    with pytest.raises(slurm_nodelist.SlurmListError, match="node list"):
        slurm_nodelist.expand_nodelist(text)


@pytest.fixture(scope="module")
def scontrol_env(tmp_path_factory):
    """An environment in which `scontrol show hostnames` runs: it only needs a slurm.conf."""
    if shutil.which("scontrol") is None:
        pytest.skip("Slurm's scontrol is not installed (Debian: slurm-client); our parser is checked alone")
    conf = tmp_path_factory.mktemp("slurmconf") / "slurm.conf"
    conf.write_text("ClusterName=check\nSlurmctldHost=localhost\n")
    return dict(os.environ, SLURM_CONF=str(conf))


def test_parser_agrees_with_scontrol(scontrol_env):
    for text in LISTS:
        assert slurm_nodelist.scontrol_hostnames(text, scontrol_env) == slurm_nodelist.expand_nodelist(text), text
    for text in INVALID:
        with pytest.raises(slurm_nodelist.SlurmListError, match="scontrol show hostnames calls it invalid"):
            slurm_nodelist.scontrol_hostnames(text, scontrol_env)


def test_hostnames_falls_back_to_the_parser_without_scontrol():
    env = dict(os.environ, PATH="/nonexistent")
    assert slurm_nodelist.hostnames("node[01-02]", env) == ["node01", "node02"]


@pytest.mark.parametrize("text,counts", [("2(x3),1", [2, 2, 2, 1]), ("4", [4]), ("1,2,3", [1, 2, 3]),
                                         ("2(x1)", [2])])
def test_task_counts(text, counts):
    assert slurm_nodelist.expand_tasks(text) == counts


@pytest.mark.parametrize("text", ["2(3)", "x", "", "2(x)"])
def test_bad_task_counts_raise(text):
    with pytest.raises(slurm_nodelist.SlurmListError, match="task counts"):
        slurm_nodelist.expand_tasks(text)


# ----------------------------------------------------------------- the allocation

NO_SCONTROL = {"PATH": "/nonexistent"}


def test_allocation_from_slurm_environment():
    env = dict(NO_SCONTROL, SLURM_JOB_ID="17", SLURM_JOB_NODELIST="node[01-03],gpu7", SLURM_TASKS_PER_NODE="2(x3),1")
    alloc = slurm_allocation.read(env)
    assert alloc.job_id == "17" and alloc.tasks == 7
    assert alloc.hosts == [hosts.Host("node01", 2), hosts.Host("node02", 2), hosts.Host("node03", 2),
                           hosts.Host("gpu7", 1)]


def test_allocation_without_per_node_counts():
    env = dict(NO_SCONTROL, SLURM_JOB_ID="3", SLURM_NODELIST="a[1-3]", SLURM_NTASKS="5")
    assert [h.slots for h in slurm_allocation.read(env).hosts] == [2, 2, 1]
    env = dict(NO_SCONTROL, SLURM_JOB_ID="3", SLURM_NODELIST="a[1-3]")
    assert [h.slots for h in slurm_allocation.read(env).hosts] == [1, 1, 1]


@pytest.mark.parametrize("env,message", [
    ({"SLURM_JOB_ID": "9"}, "SLURM_JOB_NODELIST is not"),
    ({"SLURM_JOB_ID": "9", "SLURM_JOB_NODELIST": "a[1-2]", "SLURM_TASKS_PER_NODE": "1"},
     "2 nodes .* but 1 task counts"),
    ({"SLURM_JOB_ID": "9", "SLURM_JOB_NODELIST": "a[2-1]"}, "invalid range"),
    ({"SLURM_JOB_ID": "9", "SLURM_JOB_NODELIST": "a1", "SLURM_STEP_ID": "0", "SLURM_STEP_NUM_TASKS": "4"},
     "running in each of the 4 tasks of an srun step"),
])
def test_bad_allocation_environment_is_one_line(env, message):
    with pytest.raises(slurm_allocation.SlurmAllocationError, match=message):
        slurm_allocation.read(dict(NO_SCONTROL, **env))


# ----------------------------------------------------------------- collectivesrun inside an allocation

SLURM_ENV = dict(NO_SCONTROL, SLURM_JOB_ID="42", SLURM_JOB_NODELIST="nodea,nodeb", SLURM_TASKS_PER_NODE="2,1")


def test_no_np_inside_an_allocation_takes_its_tasks():
    where = host_sources.place(cli.parse(["python", "train.py"]), SLURM_ENV)
    assert (where.np, where.bootstrap, where.check_ssh) == (3, host_sources.SLURM, False)
    assert where.hosts == [hosts.Host("nodea", 2), hosts.Host("nodeb", 1)]
    assert where.reach.what == "on its slurmd port"
    assert host_sources.place(cli.parse(["-np", "2", "python", "t.py"]), SLURM_ENV).np == 2
    # -H still wins inside an allocation: the user named the hosts.
    assert host_sources.place(cli.parse(["-np", "1", "-H", "x:1", "p"]), SLURM_ENV).bootstrap == host_sources.SSH


def test_no_np_outside_an_allocation_is_one_clear_error():
    with pytest.raises(host_sources.PlacementError, match="-np N is required: not inside a Slurm allocation"):
        host_sources.place(cli.parse(["python", "train.py"]), {})
    with pytest.raises(host_sources.PlacementError, match="-np N is required with -H"):
        host_sources.place(cli.parse(["-H", "a:1", "python", "train.py"]), {})


def test_the_launch_inside_an_allocation_goes_through_slurm():
    environ = dict(os.environ, **dict(SLURM_ENV, PATH=os.environ["PATH"]))  # the real mpirun is found on PATH
    launch = runmod.plan(cli.parse(["python", "train.py"]), environ)
    argv = launch.argv
    if mpi_locator.locate().flavor == mpi_locator.HYDRA:
        assert argv[1:7] == ["-np", "3", "-launcher", "slurm", "-hosts", "nodea:2,nodeb:1"], argv
    assert [(h.name, h.ranks, h.local) for h in launch.hosts] == [("nodea", (0, 1), False), ("nodeb", (2,), False)]
    assert argv[-1] == "train.py"


def test_threads_per_rank_follow_the_allocation():
    args = cli.parse(["python", "train.py"])
    env = dict(SLURM_ENV, SLURM_JOB_CPUS_PER_NODE="8,2")  # nodea: 8 CPUs for 2 ranks; nodeb: 2 for 1
    assert host_sources.place(args, env).threads_per_rank == 2
    assert host_sources.place(args, dict(env, SLURM_CPUS_PER_TASK="3")).threads_per_rank == 3
    assert host_sources.place(args, SLURM_ENV).threads_per_rank is None  # CPUs unknown: left to the ranks
    launch = runmod.plan(args, dict(os.environ, **dict(env, PATH=os.environ["PATH"])))
    assert launch.env["OMP_NUM_THREADS"] == "2"
    launch = runmod.plan(args, dict(os.environ, **dict(env, PATH=os.environ["PATH"], OMP_NUM_THREADS="5")))
    assert launch.env["OMP_NUM_THREADS"] == "5"  # the user's own setting wins


def test_a_failing_srun_is_noticed_and_named():
    findings = supervise.Findings()
    findings.scan("srun: error: fetch_config: DNS SRV lookup failed")
    assert not findings.alarm.is_set()  # srun's own errors before its fatal one are not the verdict
    findings.scan("srun: fatal: Could not establish a configuration source")
    assert findings.alarm.is_set()
    assert supervise.summary(findings, [], {}, "on its slurmd port") == \
        "Slurm could not start the job's step (srun: fatal: Could not establish a configuration source)"


def test_hydra_argv_for_each_bootstrap():
    hydra = mpi_locator.MpiLauncher("/m/mpirun", mpi_locator.HYDRA, "MPICH", "5.0.2", "test")
    two = [hosts.Host("a", 2), hosts.Host("b", 1)]
    assert command.build(hydra, 3, two, host_sources.SLURM, {}, None, ["p"]) == \
        ["/m/mpirun", "-np", "3", "-launcher", "slurm", "-hosts", "a:2,b:1", "p"]
    assert command.build(hydra, 3, two, host_sources.SSH, {}, None, ["p"]) == ["/m/mpirun", "-np", "3", "-hosts",
                                                                             "a:2,b:1", "p"]

