"""The elastic driver (``collectivesrun --min-np/--max-np/--host-discovery-script``), end to end.

Three "hosts" on this machine: ``localhost``, ``127.0.0.1`` and the machine's hostname. MPICH's
hydra with ``-launcher fork -hosts localhost:1,127.0.0.1:1,<hostname>:1`` starts one proxy per
name, so a host can be blacklisted while the others run (checked: each rank is told apart by
the proxy that started it). The discovery script is a real executable printing a hosts file
that the test rewrites mid-run.

* torch (hvd.elastic.TorchState + ElasticSampler): (a) on a one-host discovery (``localhost:2``)
  a rank SIGKILLs itself mid-epoch: the driver names the rank and host, keeps the host (it still
  answers: a worker failure), restarts both ranks there from the last commit, and the job ends
  with every sample used exactly once per epoch (as an uninterrupted run) and identical weights
  on every rank; (b)+(c) a host added mid-run: the job grows at the next commit; then a host
  removed: it shrinks, resuming at the very commit it stopped at.
* Keras (KerasState + CommitStateCallback): grows when a host is added, then a rank is killed:
  restart on the same hosts; the same checks.
* (d) a host whose ranks fail two generations in a row is blacklisted: alone, the driver gives
  up at once; with --blacklist-cooldown-range it returns after its cooldown and the job grows
  back; a failure beyond --reset-limit and one leaving fewer than --min-np slots end the driver
  non-zero with one clear line; every rank failing by itself is not retried; the driver killed
  with SIGKILL leaves no process behind (tests/elastic/workers/elastic_driver_contract.py: the contract
  done by hand with numpy, fast to start). The MPICH segments of killed ranks are gone after.
* The pieces (discovery output, slot assignment, flags) without launching anything.

After every run, no process carrying the test's marker may be left (tests/support/elastic_job.py).
"""
import os
import re
import shutil
import signal
import socket
import time

import pytest

from collectives.launcher import args as cli
from collectives.launcher import elastic_driver, host_discovery, host_health, host_sources
from collectives.launcher.hosts import Host
from elastic_job import ElasticJob, commit_dirs, discovery_script, leftovers, write_hosts
from mpi_launch import worker_path

A, B, C = "localhost", "127.0.0.1", socket.gethostname()
TORCH = worker_path("elastic_driver_torch.py")
KERAS = worker_path("elastic_driver_keras.py")
CONTRACT = worker_path("elastic_driver_contract.py")
N_SAMPLES = 72  # both training workers

needs_three_names = pytest.mark.skipif(C in (A, B), reason="the hostname must differ from localhost/127.0.0.1")


def elastic(script, *command, min_np=2, max_np=3, extra=()):
    return ["--min-np", min_np, "--max-np", max_np, "--host-discovery-script", script, *extra, "python", *command]


def check_training(job, size, generation, epochs):
    """The final generation's ranks all report; every sample was used exactly ``epochs`` times
    (nothing lost or repeated by the restarts); the weights are identical on every rank."""
    final = [r for r in job.results() if r["generation"] == generation]
    assert sorted(r["rank"] for r in final) == list(range(size)), job.describe()
    for r in final:
        assert r["size"] == size
        assert r["counts"] == [epochs] * N_SAMPLES, f"rank {r['rank']}: samples used {r['counts']}\n{job.describe()}"
        assert r["weights"] == final[0]["weights"], f"rank {r['rank']} weights differ\n{job.describe()}"


def start_line(job, generation, rank, size):
    """(commit, samples done) from the worker's ``start:`` line."""
    _, line = job.wait_for(rf"\[gen {generation} rank {rank}/{size}\] start: commit (\d+)")
    m = re.search(r"commit (\d+), epoch (\d+), batch (\d+), samples done (\d+)", line)
    return int(m.group(1)), int(m.group(4))


# ----------------------------------------------------------------- torch

def test_torch_rank_killed_mid_epoch_restarts_on_the_same_host_from_last_commit(tmp_path):
    # Issue 35 item 8: one host, one rank killed; the host still answers, so the job restarts
    # there (before: the host was blacklisted and the driver waited for slots until killed).
    script, _ = discovery_script(str(tmp_path), [f"{A}:2"])
    # 2 ranks, 6 batches per epoch, commits after batches 1, 3, 5 and at each epoch's end: at
    # its 9th step (epoch 1, batch 2) rank 1 dies; the last commit is 5 (epoch 1, batch 1).
    job = ElasticJob(["-np", 2] + elastic(script, TORCH, "--die-rank", 1, "--die-step", 8, min_np=1, max_np=2,
                                          extra=("--elastic-timeout", 10)), timeout=300)
    assert job.finish() == 0, job.describe()
    restarts = [line for line in job.driver_lines() if "restarting" in line]
    assert len(restarts) == 1, job.describe()
    m = re.fullmatch(r"elastic: rank 1 on localhost exited with signal 9; host localhost kept: it still answers \(a "
                     r"worker failure; 1 in a row there, 2 blacklist it\); restarting 2 ranks on localhost:2 from "
                     r"commit (\d+) \(generation 1\)", restarts[0])
    assert m, job.describe()
    assert int(m.group(1)) == 5, job.describe()
    commit, done = start_line(job, 1, 0, 2)
    assert (commit, done) == (5, N_SAMPLES + N_SAMPLES // 3), job.describe()  # mid-epoch, not from the start
    check_training(job, size=2, generation=1, epochs=2)
    assert not any("blacklisted" in line for line in job.driver_lines()), job.describe()
    assert job.driver_lines()[-1].startswith("elastic: the job finished: 2 ranks exited 0"), job.describe()
    job.assert_nothing_left()


@needs_three_names
def test_torch_grows_when_a_host_is_added_and_shrinks_when_one_is_removed(tmp_path):
    script, hosts = discovery_script(str(tmp_path), [f"{A}:1", f"{B}:1"])
    job = ElasticJob(elastic(script, TORCH, "--epochs", 3, "--step-sleep", 0.4), timeout=300)
    job.wait_for(r"\[gen 0 rank 0/2\] start:")
    write_hosts(hosts, [f"{A}:1", f"{B}:1", f"{C}:1"])
    _, grow = job.wait_for(r"elastic: the ranks stopped at commit \d+ for the new host set; restarting")
    stopped_at = int(re.search(r"commit (\d+)", grow).group(1))
    assert grow.endswith(f"restarting 3 ranks on localhost:1,127.0.0.1:1,{C}:1 from commit {stopped_at} "
                         "(generation 1)"), job.describe()
    commit, _ = start_line(job, 1, 0, 3)
    assert commit == stopped_at, job.describe()  # grew without rolling back
    write_hosts(hosts, [f"{A}:1", f"{C}:1"])
    _, shrink = job.wait_for(r"elastic: the ranks stopped at commit \d+ for the new host set; restarting 2")
    stopped_at = int(re.search(r"commit (\d+)", shrink).group(1))
    assert shrink.endswith(f"restarting 2 ranks on localhost:1,{C}:1 from commit {stopped_at} (generation 2)")
    assert job.finish() == 0, job.describe()
    commit, _ = start_line(job, 2, 0, 2)
    assert commit == stopped_at, job.describe()  # shrank without rolling back
    assert not any("blacklisted" in line for line in job.driver_lines()), job.describe()
    check_training(job, size=2, generation=2, epochs=3)
    job.assert_nothing_left()


# ----------------------------------------------------------------- Keras

@needs_three_names
def test_keras_grows_then_survives_a_killed_rank(tmp_path):
    script, hosts = discovery_script(str(tmp_path), [f"{A}:1", f"{B}:1"])
    job = ElasticJob(elastic(script, KERAS, "--die-rank", 2, "--die-generation", 1, "--die-step", 3,
                             "--step-sleep", 0.3), timeout=400)
    job.wait_for(r"\[gen 0 rank 0/2\] start:")
    write_hosts(hosts, [f"{A}:1", f"{B}:1", f"{C}:1"])
    _, grow = job.wait_for(r"elastic: the ranks stopped at commit \d+ for the new host set; restarting 3")
    stopped_at = int(re.search(r"commit (\d+)", grow).group(1))
    commit, _ = start_line(job, 1, 0, 3)
    assert commit == stopped_at, job.describe()
    assert job.finish() == 0, job.describe()
    failure = [line for line in job.driver_lines() if "exited with signal 9" in line]
    assert len(failure) == 1, job.describe()
    m = re.fullmatch(rf"elastic: rank 2 on {re.escape(C)} exited with signal 9; host {re.escape(C)} kept: it still "
                     r"answers \(a worker failure; 1 in a row there, 2 blacklist it\); restarting 3 ranks on "
                     rf"localhost:1,127\.0\.0\.1:1,{re.escape(C)}:1 from commit (\d+) \(generation 2\)", failure[0])
    assert m, job.describe()
    commit, done = start_line(job, 2, 0, 3)
    assert commit == int(m.group(1)) and done > 0, job.describe()
    final = [r for r in job.results() if r["generation"] == 2]
    assert sorted(r["rank"] for r in final) == [0, 1, 2], job.describe()
    for r in final:  # every epoch ran its 6 batches once over the restarts; the same weights everywhere
        assert (r["epoch"], r["batches"], r["weights"]) == (2, [6, 6], final[0]["weights"]), job.describe()
    job.assert_nothing_left()


# ----------------------------------------------------------------- giving up, and the driver killed

KEPT = r"host {0} kept: it still answers \(a worker failure; 1 in a row there, 2 blacklist it\)"
TWICE = r"host {0} blacklisted: its ranks failed 2 generations in a row"


def segments_of(job, generation):
    """The MPICH segments the contract worker's ranks of ``generation`` reported mapping."""
    found = []
    for line in job.text().splitlines():
        m = re.match(rf"\[gen {generation} rank \d+\] segments: (.*)$", line)
        if m:
            found += m.group(1).split()
    return found


def test_a_lone_host_failing_twice_in_a_row_ends_the_driver_at_once(tmp_path):
    # Before: the first failure blacklisted the only host and the driver waited for slots
    # (--elastic-timeout, 600 s) until the test's deadline.
    script, _ = discovery_script(str(tmp_path), [f"{A}:2"])
    job = ElasticJob(elastic(script, CONTRACT, "--die-rank", 1, "--die-step", 4, "--die-always", min_np=1,
                             max_np=2), timeout=90)
    code = job.finish()
    lines = job.driver_lines()
    assert code == 128 + signal.SIGKILL, job.describe()
    assert re.fullmatch(rf"elastic: rank 1 on localhost exited with signal 9; {KEPT.format('localhost')}; restarting "
                        r"2 ranks on localhost:2 from commit \d+ \(generation 1\)", lines[-2]), job.describe()
    assert lines[-1] == ("elastic: rank 1 on localhost exited with signal 9; host localhost blacklisted: its ranks "
                         "failed 2 generations in a row; giving up: every host is blacklisted (localhost) "
                         "(exit status 137)"), job.describe()
    job.assert_nothing_left()
    # Issue 35 item 9: the driver removed the MPICH segments of both killed generations.
    left = [p for g in (0, 1) for p in segments_of(job, g) if os.path.exists(p)]
    assert segments_of(job, 0) and not left, f"left in /dev/shm: {left}\n{job.describe()}"


def test_a_blacklisted_host_returns_after_its_cooldown(tmp_path):
    script, _ = discovery_script(str(tmp_path), [f"{A}:1", f"{B}:1"])
    job = ElasticJob(elastic(script, CONTRACT, "--die-rank", 1, "--die-step", 4, "--die-until", 1, "--step-sleep",
                             0.1, min_np=1, max_np=2, extra=("--blacklist-cooldown-range", 1, 4)), timeout=150)
    assert job.finish() == 0, job.describe()
    lines = job.driver_lines()
    restarts = [line for line in lines if "restarting" in line]
    assert len(restarts) == 3, job.describe()
    assert re.fullmatch(rf"elastic: rank 1 on 127\.0\.0\.1 exited with signal 9; {KEPT.format('127.0.0.1')}; "
                        r"restarting 2 ranks on localhost:1,127\.0\.0\.1:1 from commit \d+ \(generation 1\)",
                        restarts[0]), job.describe()
    assert re.fullmatch(r"elastic: rank 1 on 127\.0\.0\.1 exited with signal 9; host 127\.0\.0\.1 blacklisted for 1 s "
                        r"\(--blacklist-cooldown-range 1 4\): its ranks failed 2 generations in a row; restarting 1 "
                        r"ranks on localhost:1 from commit \d+ \(generation 2\)", restarts[1]), job.describe()
    assert "elastic: host 127.0.0.1: its blacklist cooldown is over; it is usable again" in lines, job.describe()
    assert re.fullmatch(r"elastic: the ranks stopped at commit \d+ for the new host set; restarting 2 ranks on "
                        r"localhost:1,127\.0\.0\.1:1 from commit \d+ \(generation 3\)", restarts[2]), job.describe()
    final = [r for r in job.results() if r["generation"] == 3]
    assert sorted(r["rank"] for r in final) == [0, 1], job.describe()
    assert all(r["processed"] == 480 and r["w"] == final[0]["w"] for r in final), job.describe()
    job.assert_nothing_left()


def test_failures_beyond_the_reset_limit_end_the_driver(tmp_path):
    script, _ = discovery_script(str(tmp_path), [f"{A}:2", f"{B}:2"])
    job = ElasticJob(elastic(script, CONTRACT, "--die-rank", 1, "--die-step", 4, "--die-always", min_np=1,
                             max_np=4, extra=("--reset-limit", 1)), timeout=180)
    code = job.finish()
    lines = job.driver_lines()
    assert code == 128 + signal.SIGKILL, job.describe()
    assert re.fullmatch(rf"elastic: rank 1 on localhost exited with signal 9; {KEPT.format('localhost')}; restarting "
                        r"4 ranks on localhost:2,127\.0\.0\.1:2 from commit \d+ \(generation 1\)", lines[-2]), job.describe()
    assert lines[-1] == (f"elastic: rank 1 on localhost exited with signal 9; {TWICE.format('localhost')}; giving "
                         "up: the job was already restarted 1 times (--reset-limit 1) (exit status 137)"), job.describe()
    job.assert_nothing_left()


def test_fewer_slots_than_min_np_end_the_driver_after_the_elastic_timeout(tmp_path):
    script, _ = discovery_script(str(tmp_path), [f"{A}:1", f"{B}:1"])
    job = ElasticJob(elastic(script, CONTRACT, "--die-rank", 0, "--die-step", 4, "--die-always", min_np=2, max_np=2,
                             extra=("--elastic-timeout", 2)), timeout=180)
    code = job.finish()
    lines = job.driver_lines()
    assert code == 128 + signal.SIGKILL, job.describe()
    assert lines[-2].startswith("elastic: waiting up to 2 s (--elastic-timeout) for 2 slots; usable now: "
                                "127.0.0.1:1"), job.describe()
    assert lines[-1] == (f"elastic: rank 0 on localhost exited with signal 9; {TWICE.format('localhost')}; giving "
                         "up: only 1 usable slots (127.0.0.1:1; blacklisted: localhost), fewer than the 2 needed, "
                         "after waiting 2 s (--elastic-timeout) (exit status 137)"), job.describe()
    job.assert_nothing_left()


def test_no_slots_at_start_end_the_driver_after_the_elastic_timeout(tmp_path):
    script, _ = discovery_script(str(tmp_path), [])
    job = ElasticJob(elastic(script, CONTRACT, extra=("--elastic-timeout", 1)), timeout=60)
    assert job.finish() == 1, job.describe()
    assert job.driver_lines()[-1] == ("elastic: error: cannot start: only 0 usable slots ((none)), fewer than the 2 "
                                      "needed, after waiting 1 s (--elastic-timeout)"), job.describe()


def test_a_program_failing_on_every_rank_is_not_restarted(tmp_path):
    script, _ = discovery_script(str(tmp_path), [f"{A}:1", f"{B}:1"])
    # No such file: python exits 2 on every rank, before any collective.
    job = ElasticJob(elastic(script, os.path.join(os.path.dirname(CONTRACT), "elastic_driver_no_such_file.py")), timeout=60)
    assert job.finish() == 2, job.describe()
    last = job.driver_lines()[-1]
    assert "exited with code 2" in last and "not restarting: every rank failed by itself" in last, job.describe()
    assert not any("restarting" in line and "not restarting" not in line for line in job.driver_lines())
    job.assert_nothing_left()


def test_the_driver_killed_leaves_no_process(tmp_path):
    script, _ = discovery_script(str(tmp_path), [f"{A}:1", f"{B}:1", f"{C}:1"])
    job = ElasticJob(elastic(script, CONTRACT, "--step-sleep", 0.5), timeout=120)
    job.wait_for(r"\[gen 0 rank 0/\d\] restored commit")
    assert len(leftovers(job.mark)) >= 6  # mpirun, proxies, wrappers, ranks
    dirs = commit_dirs(job.mark)
    assert dirs, job.describe()
    os.kill(job.proc.pid, signal.SIGKILL)
    killed_at = time.monotonic()
    assert job.finish() == -signal.SIGKILL
    job.assert_nothing_left(within=15.0)
    print(f"every process of the job gone {time.monotonic() - killed_at:.1f} s after the driver was killed")
    for d in dirs:  # a driver killed cannot clean up after itself
        shutil.rmtree(d, ignore_errors=True)


# ----------------------------------------------------------------- the pieces

def test_discovery_output_is_parsed_as_horovod_does():
    hosts = host_discovery.parse_discovery_output("hosta:4\n# comment\n\nhostb\n[fe80::1]:2\nhostc:1 # x\n", 3)
    assert hosts == [Host("hosta", 4), Host("hostb", 3), Host("fe80::1", 2), Host("hostc", 1)]
    with pytest.raises(host_discovery.DiscoveryError, match="line 1"):
        host_discovery.parse_discovery_output("hosta:zero\n", 1)


def test_assignment_fills_hosts_in_order_up_to_max_np():
    hosts = [Host("a", 2), Host("b", 2), Host("c", 1)]
    assert host_discovery.assign(hosts, None) == (("a", 2), ("b", 2), ("c", 1))
    assert host_discovery.assign(hosts, 3) == (("a", 2), ("b", 1))


def test_blacklisted_hosts_are_not_usable_and_order_is_kept(tmp_path):
    script, hosts = discovery_script(str(tmp_path), ["b:1", "a:2"])
    hs = host_discovery.HostSet(script=script)
    assert hs.refresh() is None
    write_hosts(hosts, ["c:1", "a:2", "b:1"])
    hs.refresh()
    hs.ban("a", "failed")
    assert hs.usable() == [Host("b", 1), Host("c", 1)]  # first-seen order; a blacklisted
    os.remove(script)
    assert "cannot run host discovery script" in hs.refresh()  # transient: the last list stays
    assert hs.usable_slots() == 2


def test_host_health_keeps_a_host_once_then_blacklists_with_backoff_cooldowns():
    now = [100.0]
    hs = host_discovery.HostSet(fixed=[Host("a", 1), Host("b", 1)])
    health = host_health.HostHealth(hs, (2, 5), clock=lambda: now[0])
    first = health.judge(["a", "b"], ["a"], [], "rank 0 failed")
    assert [(v.host, v.blacklisted) for v in first] == [("a", False)] and hs.usable_slots() == 2
    health.judge(["a", "b"], ["b"], [], "rank 1 failed")  # a generation without a failure on a: its run ends
    assert health.in_a_row == {"b": 1}
    second = health.judge(["a", "b"], ["b"], [], "rank 1 failed")
    assert second[0].text == ("host b blacklisted for 2 s (--blacklist-cooldown-range 2 5): its ranks failed 2 "
                              "generations in a row")
    assert [h.name for h in hs.usable()] == ["a"]
    assert hs.release_expired(now[0] + 1.9) == [] and hs.release_expired(now[0] + 2) == ["b"]
    lost = health.judge(["a", "b"], [], ["b"], "host b does not answer ssh")  # lost: at once; 2nd time 4 s
    assert lost[0].text == "host b blacklisted for 4 s (--blacklist-cooldown-range 2 5)"
    assert hs.release_expired(now[0] + 3.9) == [] and hs.release_expired(now[0] + 4) == ["b"]
    health.judge(["b"], [], ["b"], "again")
    assert hs.banned_until["b"] == now[0] + 5  # 2 * 2**2 = 8, at most MAX
    assert health.every_host_blacklisted() == (False, ["b"])
    forever = host_health.HostHealth(hs)  # no range: blacklisted for the rest of the run, as Horovod
    forever.judge(["a"], [], ["a"], "lost")
    assert health.every_host_blacklisted() == (True, ["a", "b"]) and hs.release_expired(1e12) == ["b"]
    assert "a" in hs.blacklist


@pytest.mark.parametrize("argv, problem", [
    (["--max-np", "2", "--blacklist-cooldown-range", "0", "5"],
     "--blacklist-cooldown-range needs 1 <= MIN <= MAX <= 3600 seconds, not 0 5"),
    (["--max-np", "2", "--blacklist-cooldown-range", "9", "5"],
     "--blacklist-cooldown-range needs 1 <= MIN <= MAX <= 3600 seconds, not 9 5"),
    (["--min-np", "3", "--max-np", "2"], "--max-np 2 is below --min-np 3"),
    (["-np", "1", "--min-np", "2"], "-np 1 is below --min-np 2"),
    (["-np", "5", "--max-np", "4"], "-np 5 is above --max-np 4"),
    (["--min-np", "0"], "--min-np must be at least 1, not 0"),
    (["--max-np", "2", "--slots-per-host", "0"], "--slots-per-host must be at least 1, not 0"),
    (["--max-np", "2", "--reset-limit", "-1"], "--reset-limit must not be negative, not -1"),
])
def test_bad_elastic_flags_are_one_line(argv, problem):
    args = cli.parse(argv + ["python", "x.py"])
    assert cli.is_elastic(args)
    assert elastic_driver.check_arguments(args) == problem


def test_elastic_flags_make_np_optional_and_plain_jobs_keep_needing_it():
    assert cli.parse(["--host-discovery-script", "d.sh", "python", "x.py"]).np is None
    # A plain job's missing -np is an error where its hosts are placed (outside a Slurm allocation).
    with pytest.raises(host_sources.PlacementError, match="-np N is required"):
        host_sources.place(cli.parse(["python", "x.py"]), {})
