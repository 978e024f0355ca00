"""hvd.elastic on real ranks under the real mpirun (tests/elastic/workers/elastic_api_worker.py).

* Under plain mpirun, Horovod-style elastic scripts run as fixed-size jobs (torch and Keras),
  against one-process references; State/ObjectState/TorchState/KerasState commit, restore, sync
  and reset callbacks; ElasticSampler's partitions.
* The restart path without the driver: the test plays the driver (a TCP server answering
  ``hosts_version <commit>`` with a version). Generation 0 on 3 ranks commits every step until
  the version changes: every rank exits 77 with its commit on disk. Generation 1 on 2 ranks,
  rank 0 on a "new host" (an empty COMMIT_DIR), restores that commit on every rank (sent by
  rank 1), runs the reset callbacks, gives each remaining sample of the epoch exactly once and
  ends with the weights of a one-process replay of the same global batches.
* A host update found by the job's own check_host_updates() after it moved on from its last
  commit: the exit commits the current state first (no roll back).
* A rank whose peer is SIGKILLed in the middle of training (MPICH's mpirun ends it), then a new
  generation that resumes from the newest commit and ends equal to an uninterrupted run.
"""
import json
import os
import pickle
import re
import socketserver
import threading

import pytest

pytest.importorskip("torch")

from mpi_launch import assert_all_ranks_passed, run_workers  # noqa: E402

from collectives.elastic import commit_codec, commit_store  # noqa: E402

TIMEOUT = 240
TF_ENV = {"TF_CPP_MIN_LOG_LEVEL": "2", "TF_ENABLE_ONEDNN_OPTS": "0"}
N_SAMPLES, PER_RANK_BATCH, EPOCHS = 48, 2, 2  # as in the worker


class DriverStandIn:
    """The driver's notification server: answers query i (0-based) with ``version_of(i)`` and
    records the commit ids the workers report."""

    def __init__(self, version_of):
        self.commit_ids = []
        outer = self

        class Handler(socketserver.StreamRequestHandler):
            def handle(self):
                line = self.rfile.readline().decode("ascii").strip()
                word, _, commit_id = line.partition(" ")
                assert word == "hosts_version", line
                with lock:
                    index = len(outer.commit_ids)
                    outer.commit_ids.append(int(commit_id))
                self.wfile.write(f"{version_of(index)}\n".encode("ascii"))

        lock = threading.Lock()
        self.server = socketserver.ThreadingTCPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.server.shutdown()
        self.server.server_close()

    @property
    def endpoint(self):
        host, port = self.server.server_address
        return f"{host}:{port}"


def elastic_env(driver, commit_dir, generation, hosts_version):
    return {"COLLECTIVES_ELASTIC": "1", "COLLECTIVES_ELASTIC_DRIVER": driver.endpoint,
            "COLLECTIVES_ELASTIC_JOB_ID": "test", "COLLECTIVES_ELASTIC_GENERATION": str(generation),
            "COLLECTIVES_ELASTIC_COMMIT_DIR": str(commit_dir),
            "COLLECTIVES_ELASTIC_HOSTS_VERSION": str(hosts_version)}


def events(report_dir, mode, generation, rank):
    path = os.path.join(report_dir, f"{mode}.g{generation}.rank{rank}.jsonl")
    with open(path) as f:
        return [json.loads(line) for line in f]


def batch_indices(evs, epoch):
    return [i for e in evs if e["event"] == "batch" and e["epoch"] == epoch for i in e["indices"]]


def test_torch_api_under_plain_mpirun(tmp_path):
    run = run_workers(2, "elastic_api_worker.py", "torch_api", tmp_path, timeout=TIMEOUT)
    assert_all_ranks_passed(run, 2, min_cases=8)
    # The elastic job gave each sample exactly once per epoch over the 2 ranks.
    for epoch in range(EPOCHS):
        given = [i for r in range(2) for i in batch_indices(events(tmp_path, "torch_api", 0, r), epoch)]
        assert sorted(given) == list(range(N_SAMPLES)), (epoch, sorted(given))


def test_keras_api_under_plain_mpirun(tmp_path):
    pytest.importorskip("tensorflow")
    run = run_workers(2, "elastic_api_worker.py", "keras_api", tmp_path, timeout=TIMEOUT, env=TF_ENV)
    assert_all_ranks_passed(run, 2, min_cases=2)


def test_restart_path_hosts_updated_then_resumed_on_fewer_ranks(tmp_path):
    commit_dir, reports = tmp_path / "commits", tmp_path / "reports"
    reports.mkdir()
    # Generation 0, 3 ranks: the driver's version changes at the 3rd query (commit 3).
    with DriverStandIn(lambda i: 0 if i < 2 else 1) as driver:
        run = run_workers(3, "elastic_api_worker.py", "restart", reports, "3:3,2:end", timeout=TIMEOUT,
                          env=elastic_env(driver, commit_dir, 0, 0), expect_success=False)
    assert run.returncode == 77, run.describe()
    for r in range(3):
        assert re.search(rf"elastic: rank {r}: the host set changed \(version 0 -> 1\) at commit 3, which is on "
                         rf"disk; exiting with status 77", run.stderr), run.describe()
    assert driver.commit_ids == [1, 2, 3], driver.commit_ids
    files = sorted(commit_store.list_complete(str(commit_dir)), key=lambda c: c.rank)
    assert [(c.commit_id, c.generation, c.rank) for c in files] == [(3, 0, r) for r in range(3)], files
    for c in files:  # complete and readable: the header matches the size and the id is inside
        commit_id, generation, obj = commit_codec.decode(commit_store.read_file(c))
        assert (commit_id, generation) == (3, 0) and "handlers" in obj
    gen0 = [events(reports, "restart", 0, r) for r in range(3)]
    done_in_gen0 = [i for evs in gen0 for i in batch_indices(evs, 0)]
    assert len(done_in_gen0) == 3 * 3 * PER_RANK_BATCH and len(set(done_in_gen0)) == len(done_in_gen0)
    assert not any(e["event"] in ("finished", "reset_callback") for evs in gen0 for e in evs)

    # Generation 1, 2 ranks (one "host" fewer), rank 0 on a new host whose COMMIT_DIR is empty:
    # rank 1 holds commit 3 and sends it; both restore it and finish.
    with DriverStandIn(lambda i: 1) as driver:
        run = run_workers(2, "elastic_api_worker.py", "restart", reports, "3:3,2:end", timeout=TIMEOUT,
                          env=dict(elastic_env(driver, commit_dir, 1, 1), ELASTIC_TEST_FRESH_HOST_RANKS="0"))
    assert re.search(r"elastic: generation 1 on 2 ranks: restored commit 3 \(written in generation 0\) from rank 1",
                     run.stderr), run.describe()
    gen1 = [events(reports, "restart", 1, r) for r in range(2)]
    for r, evs in enumerate(gen1):
        kinds = [e["event"] for e in evs]
        assert kinds[0] == "reset_callback" and kinds[1] == "start" and kinds[-1] == "finished", (r, kinds)
        assert evs[0]["size"] == 2 and evs[0]["commit"] == 3, evs[0]
        start = evs[1]
        assert start["commit"] == 3 and start["epoch"] == 0, start
        assert start["processed"] == sorted(done_in_gen0), (start["processed"], sorted(done_in_gen0))
    # Every rank restored the same weights, those rank 0 of generation 0 committed.
    assert gen1[0][1]["weights"] == gen1[1][1]["weights"]
    # Each sample not processed before the restart is given exactly once in the rest of epoch 0,
    # and every sample once in epoch 1.
    rest = [i for evs in gen1 for i in batch_indices(evs, 0)]
    assert sorted(rest) == sorted(set(range(N_SAMPLES)) - set(done_in_gen0)), sorted(rest)
    assert sorted(i for evs in gen1 for i in batch_indices(evs, 1)) == list(range(N_SAMPLES))
    # Final weights: equal on both ranks and to one process replaying the same global batches.
    finished = [evs[-1] for evs in gen1]
    assert finished[0]["weights"] == finished[1]["weights"]
    for got, want in zip(finished[0]["weights"], finished[0]["expected"]):
        assert got == pytest.approx(want, rel=1e-9, abs=1e-12), (got, want)
    steps_in_gen1 = -(-(N_SAMPLES - len(done_in_gen0)) // (2 * PER_RANK_BATCH)) + N_SAMPLES // (2 * PER_RANK_BATCH)
    assert finished[0]["commit"] == 3 + steps_in_gen1, finished[0]
    newest = {c.rank: c.key for c in commit_store.list_complete(str(commit_dir))}
    assert newest == {0: (3, 0), 1: (3 + steps_in_gen1, 1), 2: (3, 0)}, newest
    new_host = {c.rank: c.key for c in commit_store.list_complete(str(commit_dir / "new-host-rank0"))}
    assert new_host == {0: (3 + steps_in_gen1, 1)}, new_host


def test_host_update_found_outside_a_commit_is_committed_at_exit(tmp_path):
    """check_host_updates() of the job's own, after the state moved on from its last commit:
    every rank exits 77 having committed the current values (no roll back)."""
    commit_dir, reports = tmp_path / "commits", tmp_path / "reports"
    reports.mkdir()
    with DriverStandIn(lambda i: 0 if i < 1 else 1) as driver:
        run = run_workers(2, "elastic_api_worker.py", "direct_check", reports, timeout=TIMEOUT,
                          env=elastic_env(driver, commit_dir, 0, 0), expect_success=False)
    assert run.returncode == 77, run.describe()
    assert driver.commit_ids == [1, 1], driver.commit_ids
    for r in range(2):
        assert f"elastic: rank {r}: the host set changed (version 0 -> 1) at commit 2, which is on disk" in run.stderr, \
            run.describe()
        kinds = [e["event"] for e in events(reports, "direct_check", 0, r)]
        assert kinds == ["start"], kinds
    for c in commit_store.list_complete(str(commit_dir)):
        commit_id, _, obj = commit_codec.decode(commit_store.read_file(c))
        assert commit_id == 2
        assert pickle.loads(obj["objects"]) == {"step": 2, "note": "after commit 1"}


def test_peer_killed_then_resumed(tmp_path):
    """Rank 1 SIGKILLs itself after commit 2, between its step 3 and commit 3, while rank 0 goes
    on into commit 3. Observed with MPICH: mpirun ends rank 0 at once ("CLEANING UP REMAINING
    PROCESSES"), before the engine can report the lost peer, so rank 0 never exits 78 by itself
    here. The commits on disk survive; a new generation resumes from the newest one (3 when
    rank 0 wrote it before it was killed, else 2) and ends with the weights of an uninterrupted
    run: the steps after that commit are redone."""
    commit_dir, reports = tmp_path / "commits", tmp_path / "reports"
    reports.mkdir()
    with DriverStandIn(lambda i: 0) as driver:
        run = run_workers(2, "elastic_api_worker.py", "peer_kill", reports, "sigkill", timeout=TIMEOUT,
                          env=elastic_env(driver, commit_dir, 0, 0), expect_success=False)
    assert run.returncode != 0, run.describe()
    killed_by_mpirun = "CLEANING UP REMAINING PROCESSES" in run.stdout + run.stderr
    exited_78 = "elastic: rank 0: a collective failed" in run.stderr
    assert killed_by_mpirun or exited_78, run.describe()
    rank0, rank1 = (events(reports, "peer_kill", 0, r) for r in range(2))
    assert rank1[-1]["event"] == "killing_myself", rank1
    assert not any(e["event"] == "finished" for e in rank0), rank0
    newest = {c.rank: c.commit_id for c in commit_store.list_complete(str(commit_dir))}
    assert newest[1] == 2 and newest[0] in (2, 3), newest
    resumed_from = max(newest.values())

    with DriverStandIn(lambda i: 0) as driver:
        run = run_workers(2, "elastic_api_worker.py", "restart", reports, "2:end", timeout=TIMEOUT,
                          env=elastic_env(driver, commit_dir, 1, 0))
    assert re.search(rf"elastic: generation 1 on 2 ranks: restored commit {resumed_from} ", run.stderr), run.describe()
    gen1 = [events(reports, "restart", 1, r) for r in range(2)]
    committed = [i for evs in (rank0, rank1) for e in evs
                 if e["event"] == "batch" and e["epoch"] == 0 and e["commit"] <= resumed_from for i in e["indices"]]
    for evs in gen1:
        assert [e["event"] for e in evs][:2] == ["reset_callback", "start"], evs[:2]
        assert evs[1]["processed"] == sorted(committed)
    rest = [i for evs in gen1 for i in batch_indices(evs, 0)]
    assert sorted(committed + rest) == list(range(N_SAMPLES)), sorted(committed + rest)
    finished = [evs[-1] for evs in gen1]
    assert finished[0]["weights"] == finished[1]["weights"]
    for got, want in zip(finished[0]["weights"], finished[0]["expected"]):
        assert got == pytest.approx(want, rel=1e-9, abs=1e-12), (got, want)


def test_peer_gone_means_exit_78(tmp_path):
    """Rank 1 leaves the job with status 0 in the middle of training (mpirun does not end the
    others for a clean exit): the engine tells rank 0, whose collective raises ShutdownError
    (a HorovodInternalError); hvd.elastic.run exits 78 and leaves the commit files as they are."""
    commit_dir, reports = tmp_path / "commits", tmp_path / "reports"
    reports.mkdir()
    with DriverStandIn(lambda i: 0) as driver:
        run = run_workers(2, "elastic_api_worker.py", "peer_kill", reports, "exit", timeout=TIMEOUT,
                          env=elastic_env(driver, commit_dir, 0, 0), expect_success=False)
    assert run.returncode == 78, run.describe()
    assert re.search(r"elastic: rank 0: a collective failed \(ShutdownError: .*rank 1.*\); newest commit on this "
                     r"rank's disk: [23]; exiting with status 78", run.stderr), run.describe()
    assert [e["event"] for e in events(reports, "peer_kill", 0, 1)][-1] == "exiting"
    assert not any(e["event"] == "finished" for e in events(reports, "peer_kill", 0, 0))
    newest = {c.rank: c.commit_id for c in commit_store.list_complete(str(commit_dir))}
    assert newest[1] == 2 and newest[0] in (2, 3), newest
