"""Hierarchical allreduce and allgather (COLLECTIVES_HIERARCHICAL_ALLREDUCE / _ALLGATHER, their
HOROVOD_* twins, collectivesrun's --hierarchical-allreduce / --hierarchical-allgather).

On two simulated hosts x two ranks (tests/support/simhosts.py; root only, skipped elsewhere with the
reason), tests/engine/workers/hierarchical_worker.py runs every dtype x op with prescale/postscale,
unfused and fused, single- and multi-piece, random floats, a joined rank, a process set and
allgathers with uneven first dimensions, against numpy references; the same worker with the
knobs off gives bit-identical results (digests of every integer-valued case); and each
host's egress, read from its link's counters, is what the algorithm promises: the allgather
sends each host's block once (half the result on 2 hosts; the flat ring sends three quarters),
the allreduce the wire bound 2(H-1)/H x size. Ranks placed round-robin (hosta 0, 2; hostb 1, 3)
exercise the allgather's reordering of the hosts' blocks.

The fallbacks give correct results with the knobs on: hosts with different numbers of ranks
(2+1: the allreduce runs flat, the allgather still hierarchical), one host (plain mpirun -np 3),
process sets other than the whole job, tensors with fewer elements than a host has ranks.
A value that is not a boolean stops init() on every rank with the variable's name.
"""
import os
import re
import sys

import pytest

import simhosts
from collectives import InvalidArgumentError, config
from collectives.launcher import args as launcher_args
from collectives.launcher import environment
from mpi_launch import assert_all_ranks_passed, assert_same_digests, run_workers, worker_path

REASON = simhosts.unavailable_reason()
multihost = pytest.mark.skipif(REASON is not None, reason=f"needs simulated hosts: {REASON}")
PY = sys.executable
EVERYTHING = ["allreduce", "fused", "float", "join", "process_set", "allgather", "traffic"]
WORKER = worker_path("hierarchical_worker.py")
ON = ["--hierarchical-allreduce", "--hierarchical-allgather", "--log-level", "info"]
MIB = 1 << 20


@pytest.fixture(scope="module")
def sim():
    with simhosts.SimHosts(["hosta", "hostb"]) as hosts:
        yield hosts


def launch(sim, placement, flags, *parts, env=None, timeout=240):
    np_ = sum(int(h.split(":")[1]) for h in placement.split(","))
    run = sim.run("hosta", [PY, "-m", "collectives.run", "-np", np_, "-H", placement, *flags, PY, WORKER, *parts],
                  timeout=timeout, env=env)
    left = {h: p for h, p in sim.processes().items() if p}
    sim.kill_everything()
    assert run.returncode == 0, run.describe()
    assert not left, f"processes left on the hosts: {left}"
    return run


def egress(run):
    """{(op, host): bytes sent / payload}"""
    found = re.findall(r"egress (\w+) (host\w) (\d+) (\d+)", run.stdout)
    assert len(found) == 4, run.describe()
    return {(op, host): int(sent) / int(payload) for op, host, sent, payload in found}


@multihost
def test_two_hosts_match_numpy_and_flat_and_send_the_wire_bound(sim):
    hier = launch(sim, "hosta:2,hostb:2", ON, *EVERYTHING)
    assert_all_ranks_passed(hier, 4, min_cases=130)
    assert "hierarchical allreduce on 2 hosts" in hier.stderr, hier.describe()
    assert "hierarchical allgather on 2 hosts" in hier.stderr, hier.describe()
    flat = launch(sim, "hosta:2,hostb:2", [], "allreduce", "fused", "allgather", "traffic")  # the digested cases
    assert_all_ranks_passed(flat, 4, min_cases=120)
    assert "hierarchical" not in flat.stderr, flat.describe()

    assert_same_digests(hier, flat, "hierarchical results differ from flat ones", minimum=101)

    # Bytes each host sent per byte of result (TCP/IP headers add ~5%): the allreduce at the
    # wire bound, the allgather each host's block once; the flat ring's allgather sends 3/4.
    h, f = egress(hier), egress(flat)
    print("egress per payload byte: hierarchical", h, "flat", f)
    for host in ("hosta", "hostb"):
        assert h[("allreduce", host)] < 1.1, h
        assert h[("allgather", host)] < 0.55, h
        assert f[("allgather", host)] > 0.7, f  # what the test would see without the hierarchical allgather


@multihost
def test_uneven_hosts_allreduce_falls_back_to_flat(sim):
    # 2+1: no partner of local rank 1 on hostb, so the allreduce runs flat; the allgather
    # does not need one and stays hierarchical. Horovod's variable names, set in the launcher's
    # environment, reach every rank.
    env = {"HOROVOD_HIERARCHICAL_ALLREDUCE": "1", "HOROVOD_HIERARCHICAL_ALLGATHER": "true",
           "COLLECTIVES_LOG_LEVEL": "info"}
    run = launch(sim, "hosta:2,hostb:1", [], "allreduce", "fused", "join", "allgather", env=env)
    assert_all_ranks_passed(run, 3, min_cases=100)
    assert "hierarchical allreduce falls back to flat: the hosts run different numbers of ranks" in run.stderr, \
        run.describe()
    assert "hierarchical allgather on 2 hosts" in run.stderr, run.describe()


@multihost
def test_ranks_alternating_between_hosts(sim):
    # MPICH's -ppn 1 places ranks round-robin: hosta runs 0 and 2, hostb 1 and 3, so the hosts'
    # blocks of an allgather are not in rank order and the first ranks reorder them.
    mpirun = os.path.join(os.path.dirname(PY), "mpirun")
    knobs = ["-genv", "COLLECTIVES_HIERARCHICAL_ALLREDUCE", "1", "-genv", "COLLECTIVES_HIERARCHICAL_ALLGATHER", "1",
             "-genv", "COLLECTIVES_LOG_LEVEL", "info"]
    run = sim.run("hosta", [mpirun, "-hosts", "hosta:2,hostb:2", "-ppn", "1", "-np", 4, *knobs, PY, WORKER, "fused",
                            "join", "allgather", "traffic"], timeout=240)
    left = {h: p for h, p in sim.processes().items() if p}
    sim.kill_everything()
    assert run.returncode == 0 and not left, f"{run.describe()}\nleft: {left}"
    assert_all_ranks_passed(run, 4, min_cases=25)
    assert "hierarchical allgather on 2 hosts" in run.stderr, run.describe()
    hosts = dict(re.findall(r"\[rank (\d)\] on (host\w)", run.stdout))
    assert hosts == {"0": "hosta", "1": "hostb", "2": "hosta", "3": "hostb"}, run.describe()
    e = egress(run)
    assert all(e[("allgather", h)] < 0.55 for h in ("hosta", "hostb")), e


def test_one_host_falls_back_with_correct_results():
    env = {"COLLECTIVES_HIERARCHICAL_ALLREDUCE": "1", "COLLECTIVES_HIERARCHICAL_ALLGATHER": "1",
           "COLLECTIVES_LOG_LEVEL": "info"}
    run = run_workers(3, "hierarchical_worker.py", "allreduce", "fused", "process_set", "allgather", env=env,
                      timeout=240)
    assert_all_ranks_passed(run, 3, min_cases=100)
    assert "hierarchical allreduce falls back to flat: all ranks are on one host" in run.stderr, run.describe()


def test_non_boolean_value_stops_init_on_every_rank():
    variable = "COLLECTIVES_HIERARCHICAL_ALLREDUCE"
    run = run_workers(2, "config_worker.py", variable, env={variable: "sometimes"}, timeout=120)
    assert_all_ranks_passed(run, 2, min_cases=2)
    with pytest.raises(InvalidArgumentError, match="HOROVOD_HIERARCHICAL_ALLGATHER='2' is not a valid value"):
        config.load({"HOROVOD_HIERARCHICAL_ALLGATHER": "2"})


def test_launcher_flags_and_variables():
    args = launcher_args.parse(["-np", "4", "--hierarchical-allreduce", "--hierarchical-allgather", "prog"])
    assert environment.knob_variables(args) == {"COLLECTIVES_HIERARCHICAL_ALLREDUCE": "1",
                                                "COLLECTIVES_HIERARCHICAL_ALLGATHER": "1"}
    assert environment.knob_variables(launcher_args.parse(["-np", "4", "prog"])) == {}
    values = config.load({"HOROVOD_HIERARCHICAL_ALLREDUCE": "1", "COLLECTIVES_HIERARCHICAL_ALLGATHER": "off",
                          "HOROVOD_HIERARCHICAL_ALLGATHER": "1"})
    engine = config.engine_config(values)
    assert engine["hierarchical_allreduce"] is True and engine["hierarchical_allgather"] is False
