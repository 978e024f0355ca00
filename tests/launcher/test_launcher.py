"""collectivesrun: real launches under the real MPI launcher (np 1..4 on this machine, knobs
forwarded and visible to the ranks and the engine), clear one-line failures for bad hosts and
a missing launcher, --check-build, `python -m collectives.run`, oversubscription, plus the
pieces (host lists, environment, launcher argv, MPI lookup) checked without launching."""
import json
import os
import re
import signal
import subprocess
import sys

import pytest

from collectives.launcher import cli as runmod
from collectives.launcher import args as cli
from collectives.launcher import command, environment, hosts, mpi_locator, reachability
from collectives.launcher.elf_deps import read_dynamic
from mpi_launch import SUPPORT, assert_all_ranks_passed, Run, worker_path

MIB = 1024 * 1024
SCRIPT = os.path.join(os.path.dirname(sys.executable), "collectivesrun")
WORKER = worker_path("launcher_worker.py")
CORES = runmod.usable_cores()
# Variables a developer's shell might carry that would change what the launcher decides.
SCRUBBED = ("OMP_NUM_THREADS", "MPIR_CVAR_ENABLE_HEAVY_YIELD", "COLLECTIVES_MPIRUN", "COLLECTIVES_NCCL_LIBRARY")


def launch(argv, env=None, timeout=60, module=False):
    """collectivesrun (or python -m collectives.run) with a hard timeout; the whole process
    group is killed when it runs over."""
    # SLURM_*: run inside an allocation, collectivesrun would place the ranks on its nodes.
    full_env = {k: v for k, v in os.environ.items()
                if k not in SCRUBBED and not k.startswith(("COLLECTIVES_", "HOROVOD_", "SLURM_"))}
    full_env["PYTHONUNBUFFERED"] = "1"
    # the workers' shared modules (common.py) live in tests/support, not beside the worker
    full_env["PYTHONPATH"] = os.pathsep.join(filter(None, [SUPPORT, full_env.get("PYTHONPATH")]))
    full_env.update(env or {})
    program = [sys.executable, "-m", "collectives.run"] if module else [SCRIPT]
    proc = subprocess.Popen(program + list(map(str, argv)), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=full_env, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        raise AssertionError(f"{argv} timed out after {timeout} s\n--- stdout ---\n{out}\n--- stderr ---\n{err}")
    return Run(proc.returncode, out, err)


def seen_by_ranks(out_dir):
    """What each rank reported (launcher_worker.py --out DIR), by rank."""
    found = {}
    for name in os.listdir(out_dir):
        with open(os.path.join(out_dir, name)) as f:
            seen = json.load(f)
        found[seen["rank"]] = seen
    return found


def timeline_names(path):
    with open(path) as f:
        return {e.get("name") for e in json.load(f) if e.get("ph") == "B"}


def assert_one_line_error(run, *needles):
    assert run.returncode != 0, run.describe()
    lines = [line for line in run.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, f"expected one line on stderr:\n{run.describe()}"
    assert lines[0].startswith("collectivesrun: error:"), run.describe()
    for needle in needles:
        assert needle in lines[0], f"{needle!r} not in the message:\n{run.describe()}"


def test_console_script_is_installed():
    assert os.path.exists(SCRIPT), f"{SCRIPT} missing: run `pip install --no-build-isolation -e .`"


# ----------------------------------------------------------------- real launches

@pytest.mark.parametrize("np_", [1, 2, 3, 4])
def test_ranks_run_and_see_the_forwarded_knobs(np_, tmp_path):
    timeline = tmp_path / "timeline.json"
    out = tmp_path / "seen"
    out.mkdir()
    placement = []
    if np_ == 2:
        placement = ["-H", "localhost:2"]
    elif np_ == 4:  # two names of this machine: still all local, so no ssh
        hostfile = tmp_path / "hosts"
        hostfile.write_text("# this machine twice\nlocalhost slots=2\n127.0.0.1:2\n")
        placement = ["--hostfile", hostfile]
    run = launch(["-np", np_, *placement, "--fusion-threshold-mb", "2", "--cycle-time-ms", "3.5",
                  "--timeline-filename", timeline, "--stall-check-time", "7",
                  "-x", "LAUNCH_TEST_SET=hello world", "-x", "LAUNCH_TEST_PASS",
                  "python", WORKER, "--out", out, "LAUNCH_TEST_SET", "LAUNCH_TEST_PASS", "OMP_NUM_THREADS",
                  "MPIR_CVAR_ENABLE_HEAVY_YIELD"],
                 env={"LAUNCH_TEST_PASS": "from the shell"})
    assert run.returncode == 0, run.describe()
    assert_all_ranks_passed(run, np_, min_cases=2)
    seen = seen_by_ranks(out)
    assert sorted(seen) == list(range(np_)), run.describe()
    oversubscribed = np_ > CORES
    for rank, s in seen.items():
        assert s["size"] == np_ and s["local_size"] == np_
        cfg, env = s["config"], s["env"]
        assert cfg["fusion_threshold"] == 2 * MIB
        assert cfg["cycle_time_ms"] == 3.5
        assert cfg["timeline_path"] == str(timeline)
        assert cfg["stall_check_s"] == 7.0
        assert env["LAUNCH_TEST_SET"] == "hello world"
        assert env["LAUNCH_TEST_PASS"] == "from the shell"
        assert env["OMP_NUM_THREADS"] == str(max(1, CORES // np_))
        assert env["MPIR_CVAR_ENABLE_HEAVY_YIELD"] == ("1" if oversubscribed else None)
    # The engine itself took the timeline path and the fusion threshold.
    names = timeline_names(timeline)
    assert "ALLREDUCE" in names and "MEMCPY_IN_FUSION_BUFFER" in names, names
    warned = "oversubscribed" in run.stderr
    assert warned == oversubscribed, run.describe()
    if oversubscribed:
        assert f"{np_} ranks on {CORES} cores" in run.stderr


def test_zero_fusion_threshold_reaches_the_engine(tmp_path):
    timeline = tmp_path / "timeline.json"
    run = launch(["-np", 2, "--fusion-threshold-mb", "0", "--timeline-filename", timeline, "python", WORKER])
    assert run.returncode == 0, run.describe()
    assert_all_ranks_passed(run, 2, min_cases=2)
    names = timeline_names(timeline)
    assert "MPI_ALLREDUCE" in names and "MEMCPY_IN_FUSION_BUFFER" not in names, names


def test_python_dash_m_works_like_the_script(tmp_path):
    run = launch(["-np", 2, "--stall-check-warning-time-seconds", "9", "--log-level", "ERROR",
                  "python", WORKER, "--out", tmp_path], module=True)
    assert run.returncode == 0, run.describe()
    assert_all_ranks_passed(run, 2, min_cases=2)
    seen = seen_by_ranks(tmp_path)
    assert sorted(seen) == [0, 1]
    for s in seen.values():
        assert s["config"]["stall_check_s"] == 9.0 and s["config"]["log_level"] == "error"


def test_exit_status_of_a_failing_rank_comes_back():
    run = launch(["-np", 2, "python", "-c", "import sys; sys.exit(3)"])
    assert run.returncode != 0, run.describe()


# ----------------------------------------------------------------- clear failures

def test_unresolvable_host_is_named():
    run = launch(["-np", 1, "-H", "no-such-host.invalid:1", "python", WORKER], timeout=30)
    assert_one_line_error(run, "no-such-host.invalid", "resolve")


def test_unreachable_remote_host_is_named():
    # 192.0.2.1 (TEST-NET-1) resolves but is no machine of ours: the ssh check fails fast.
    run = launch(["-np", 2, "--start-timeout", "2", "-H", "192.0.2.1:2", "python", WORKER], timeout=30)
    assert_one_line_error(run, "192.0.2.1", "ssh")


def test_ssh_failures_read_as_one_line_naming_the_host():
    refused = reachability.ssh_failure("b", 255, "Warning: x\nroot@b: Permission denied (publickey,password).\n")
    assert refused == ("host 'b' refused the ssh login (root@b: Permission denied (publickey,password)); "
                       "collectivesrun needs ssh to every remote host without a password prompt (a key, as for "
                       "horovodrun)")
    timed_out = reachability.ssh_failure("c", 255, "ssh: connect to host c port 22: Connection timed out\n")
    assert timed_out == "cannot reach host 'c' over ssh: connect to host c port 22: Connection timed out"
    assert reachability.ssh_failure("d", 1, "") == "cannot reach host 'd' over ssh: ssh exited with 1"


def test_every_bad_host_is_named():
    with pytest.raises(reachability.UnreachableHostError) as e:
        reachability.check_hosts(["no-such-a.invalid", "localhost", "no-such-b.invalid"], 10)
    message = str(e.value)
    assert "\n" not in message
    assert message.index("'no-such-a.invalid'") < message.index("'no-such-b.invalid'"), message


def test_topology_on_one_machine():
    # local_size is every rank, one host, so cross_size 1 and is_homogeneous() True; the
    # multi-host placements are in tests/multihost/test_multihost.py.
    import socket

    run = launch(["-np", 3, "python", worker_path("multihost_worker.py"), f"{socket.gethostname()}:3"])
    assert run.returncode == 0, run.describe()
    assert_all_ranks_passed(run, 3, min_cases=4)
    assert run.stdout.count("is_homogeneous=True") == 3, run.describe()


def test_localhost_beside_remote_hosts_is_refused(monkeypatch):
    # Pretend 192.0.2.1 answered ssh: the job would mix this machine's loopback with a remote host.
    monkeypatch.setattr(reachability, "check_ssh", lambda name, timeout: None)
    args = cli.parse(["-np", "2", "-H", "localhost:1,192.0.2.1:1", "python", "t.py"])
    with pytest.raises(runmod.LaunchError, match="'localhost' is a loopback name"):
        runmod.plan(args, dict(os.environ))


def test_bad_hostfile_is_named(tmp_path):
    hostfile = tmp_path / "hosts"
    hostfile.write_text("localhost slots=two\n")
    run = launch(["-np", 1, "--hostfile", hostfile, "python", WORKER], timeout=30)
    assert_one_line_error(run, str(hostfile), "slots")


def test_missing_launcher_is_reported():
    run = launch(["-np", 2, "python", WORKER], env={"COLLECTIVES_MPIRUN": "/nonexistent/bin/mpirun"}, timeout=30)
    assert_one_line_error(run, "MPI launcher not found", "/nonexistent/bin/mpirun")


def test_invalid_knob_value_is_reported_before_launch():
    run = launch(["-np", 2, "--cache-capacity", "-5", "python", WORKER], timeout=30)
    assert_one_line_error(run, "COLLECTIVES_CACHE_CAPACITY")


def test_missing_np_outside_slurm_is_one_line():
    # Inside a Slurm allocation -np defaults to its tasks (tests/launcher/test_slurm_nodelist.py).
    run = launch(["python", WORKER], timeout=30)
    lines = run.stderr.strip().splitlines()
    assert run.returncode == 1 and len(lines) == 1, run.describe()
    assert lines[0].startswith("collectivesrun: error: -np N is required: not inside a Slurm allocation"), lines


# ----------------------------------------------------------------- --check-build

def test_check_build_report():
    run = launch(["--check-build"], timeout=60)
    assert run.returncode == 0, run.describe()
    out = run.stdout
    from collectives import __version__
    assert f"collectives v{__version__}:" in out
    assert re.search(r"\[X\] MPICH Version: \S+ \(MPI \d+\.\d+\)", out), out
    assert "launcher: " in out and "mpirun" in out
    assert re.search(r"\[ \] NCCL: not found", out), out  # no GPU libraries on this machine
    assert re.search(r"\[ \] CUDA: ", out), out
    from collectives.launcher.check_build import FRAMEWORKS, framework_version
    for label, module, dists in FRAMEWORKS:
        version = framework_version(module, dists)
        expected = f"[X] {label} {version}" if version else f"[ ] {label}"
        assert expected in out, f"{expected!r} missing:\n{out}"


def test_check_build_imports_no_framework():
    code = ("import sys; from collectives.launcher import check_build; check_build.report(); "
            "print(sorted(m for m in ('torch', 'tensorflow', 'keras') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().splitlines()[-1] == "[]", out.stdout


# ----------------------------------------------------------------- pieces, no launch

def test_horovodrun_spellings_parse_like_ours():
    a = cli.parse(["--num-proc", "3", "-hostfile", "f", "--stall-check-warning-time-seconds", "4",
                   "--stall-check-shutdown-time-seconds", "8", "python", "t.py", "-np", "9"])
    b = cli.parse(["-np", "3", "--hostfile", "f", "--stall-check-time", "4", "--stall-shutdown-time", "8",
                   "python", "t.py", "-np", "9"])
    assert vars(a) == vars(b)
    assert a.np == 3 and a.command == ["python", "t.py", "-np", "9"]  # the program's own flags stay its own


def test_host_list_and_hostfile_forms(tmp_path):
    assert hosts.parse_host_list("a:2,b,[fe80::1]:3") == [hosts.Host("a", 2), hosts.Host("b", 1),
                                                         hosts.Host("fe80::1", 3)]
    f = tmp_path / "hosts"
    f.write_text("a slots=4 max_slots=8\nb:2  # mpich form\n\nc\n")
    assert hosts.parse_hostfile(f) == [hosts.Host("a", 4), hosts.Host("b", 2), hosts.Host("c", 1)]
    for bad in ("a:0", "a:x", "a:2,,b"):
        with pytest.raises(hosts.HostSpecError):
            hosts.parse_host_list(bad)
    assert hosts.ranks_per_host(5, [hosts.Host("a", 2), hosts.Host("b", 1)]) == [4, 1]
    assert hosts.ranks_per_host(2, [hosts.Host("a", 2), hosts.Host("b", 2)]) == [2, 0]


def test_local_addresses():
    assert reachability.is_local_address("127.0.0.1")
    assert not reachability.is_local_address("192.0.2.1")
    assert all(s.local for s in reachability.check_hosts(["localhost", "127.0.0.1"], 5).values())


def _args(argv):
    return cli.parse(["-np", "1", *argv, "prog"])


def test_knob_flags_become_registry_variables():
    v = environment.knob_variables(_args(["--fusion-threshold-mb", "0.5", "--cycle-time-ms", "2.5",
                                          "--cache-capacity", "7", "--timeline-mark-cycles", "--no-stall-check",
                                          "--log-level", "DEBUG", "--stall-shutdown-time", "30"]))
    assert v == {"COLLECTIVES_FUSION_THRESHOLD": str(MIB // 2), "COLLECTIVES_CYCLE_TIME": "2.5",
                 "COLLECTIVES_CACHE_CAPACITY": "7", "COLLECTIVES_TIMELINE_MARK_CYCLES": "1",
                 "COLLECTIVES_STALL_CHECK_DISABLE": "1", "COLLECTIVES_LOG_LEVEL": "debug",
                 "COLLECTIVES_STALL_SHUTDOWN_TIME_SECONDS": "30"}
    with pytest.raises(environment.RankEnvironmentError, match="fusion"):
        environment.knob_variables(_args(["--fusion-threshold-mb", "-1"]))


def test_horovodrun_switch_pairs():
    """--X sets the knob to 1, horovodrun's --no-X to 0 (explicit, so the autotuner keeps it), neither
    leaves it unset; the two of a pair exclude each other."""
    assert environment.knob_variables(_args([])) == {}
    on = environment.knob_variables(_args(["--hierarchical-allreduce", "--hierarchical-allgather", "--autotune",
                                           "--timeline-mark-cycles", "--no-stall-check"]))
    off = environment.knob_variables(_args(["--no-hierarchical-allreduce", "--no-hierarchical-allgather",
                                            "--no-autotune", "--no-timeline-mark-cycles", "--stall-check"]))
    names = ["COLLECTIVES_HIERARCHICAL_ALLREDUCE", "COLLECTIVES_HIERARCHICAL_ALLGATHER", "COLLECTIVES_AUTOTUNE",
             "COLLECTIVES_TIMELINE_MARK_CYCLES", "COLLECTIVES_STALL_CHECK_DISABLE"]
    assert on == dict.fromkeys(names, "1") and off == dict.fromkeys(names, "0")
    with pytest.raises(SystemExit):
        _args(["--autotune", "--no-autotune"])


def test_rank_environment_defaults_never_override_the_user():
    hydra = mpi_locator.HYDRA
    env = environment.build(_args(["-x", "A=1", "-x", "B", "-x", "MISSING"]), {"B": "b"}, 2, 8, hydra)
    assert env.variables == {"A": "1", "B": "b", "OMP_NUM_THREADS": "4"}
    assert any("MISSING" in n for n in env.notes)
    env = environment.build(_args([]), {"OMP_NUM_THREADS": "3", "MPIR_CVAR_ENABLE_HEAVY_YIELD": "0"}, 4, 2, hydra)
    assert env.variables == {}
    assert any("oversubscribed" in n for n in env.notes)
    env = environment.build(_args(["-x", "OMP_NUM_THREADS=6"]), {}, 4, 2, hydra)
    assert env.variables == {"OMP_NUM_THREADS": "6", "MPIR_CVAR_ENABLE_HEAVY_YIELD": "1"}
    env = environment.build(_args([]), {}, 3, 2, mpi_locator.OPEN_MPI)
    assert env.variables["OMPI_MCA_mpi_yield_when_idle"] == "1"
    assert environment.build(_args([]), {}, None, 2, hydra).variables == {}  # remote only: cores unknown
    with pytest.raises(environment.RankEnvironmentError, match="not a variable name"):
        environment.build(_args(["-x", "1BAD=x"]), {}, 1, 2, hydra)


def test_launcher_argv_in_each_dialect():
    hydra = mpi_locator.MpiLauncher("/m/mpirun", mpi_locator.HYDRA, "MPICH", "5.0.2", "test")
    two = [hosts.Host("a", 2), hosts.Host("b", 2)]
    local = command.build(hydra, 4, None, True, {"X": "1 2"}, "-verbose", ["python", "t.py"])
    assert local == ["/m/mpirun", "-np", "4", "-launcher", "fork", "-genv", "X", "1 2", "-verbose", "python", "t.py"]
    remote = command.build(hydra, 4, two, False, {}, None, ["p"])
    assert remote == ["/m/mpirun", "-np", "4", "-hosts", "a:2,b:2", "p"]
    ompi4 = mpi_locator.MpiLauncher("/o/mpirun", mpi_locator.OPEN_MPI, "Open MPI", "4.1.5", "test")
    argv = command.build(ompi4, 3, None, True, {"X": "1"}, None, ["p"])
    assert argv[:5] == ["/o/mpirun", "-np", "3", "-H", "localhost:3"]
    assert "--oversubscribe" in argv and "-x" in argv and "X=1" in argv and argv[-1] == "p"
    ompi5 = mpi_locator.MpiLauncher("/o/mpirun", mpi_locator.OPEN_MPI, "Open MPI", "5.0.3", "test")
    argv = command.build(ompi5, 3, two, False, {}, None, ["p"])
    assert "a:2,b:2" in argv and "slot:OVERSUBSCRIBE" in argv


def _fake_launcher(tmp_path, name, version_text):
    path = tmp_path / name
    path.write_text(f"#!/bin/sh\ncat <<'EOF'\n{version_text}\nEOF\n")
    path.chmod(0o755)
    return str(path)


def test_launcher_flavour_from_version_output(tmp_path):
    cases = {"HYDRA build details:\n    Version:   4.2.0": (mpi_locator.HYDRA, "MPICH", "4.2.0"),
             "mpirun (Open MPI) 4.1.5\n\nReport bugs": (mpi_locator.OPEN_MPI, "Open MPI", "4.1.5"),
             "Intel(R) MPI Library for Linux* OS, Version 2021.10 Build": (mpi_locator.HYDRA, "Intel MPI", "2021.10"),
             "something else": (mpi_locator.UNKNOWN, "unknown", "?")}
    for i, (text, expected) in enumerate(cases.items()):
        assert mpi_locator.identify(_fake_launcher(tmp_path, f"l{i}", text)) == expected


def test_launcher_lookup_prefers_the_engines_mpi(tmp_path):
    engine = mpi_locator.engine_mpi()
    assert engine is not None and engine.soname, "the engine is not built"
    launcher = mpi_locator.locate({"PATH": ""})
    if engine.library_dir:  # built against an MPI found through the rpath (the mpich wheel here)
        assert launcher.found_by.startswith("the engine's MPI")
        assert os.path.dirname(os.path.dirname(launcher.path)) == os.path.dirname(engine.library_dir)
    fake_ompi = _fake_launcher(tmp_path, "mpirun", "mpirun (Open MPI) 5.0.3")
    chosen = mpi_locator.locate({"COLLECTIVES_MPIRUN": fake_ompi})
    assert chosen.path == fake_ompi and chosen.flavor == mpi_locator.OPEN_MPI
    if engine.soname.startswith("libmpi.so.12"):
        assert any("different MPI" in w for w in chosen.warnings)
    with pytest.raises(mpi_locator.LauncherError, match="does not exist"):
        mpi_locator.locate({"COLLECTIVES_MPIRUN": "no-such-mpirun", "PATH": str(tmp_path)})


def test_engine_dependencies_read_from_the_binary():
    engine = mpi_locator.engine_mpi()
    info = read_dynamic(engine.engine_path)
    assert any(n.startswith("libmpi") for n in info.needed)
    assert read_dynamic(__file__) is None


def test_bare_python_means_this_interpreter(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))
    assert runmod.interpreter_for("python") == sys.executable
    assert runmod.interpreter_for("bash") == "bash"
    assert runmod.interpreter_for("/usr/bin/python3") == "/usr/bin/python3"
    monkeypatch.setenv("PATH", os.path.dirname(sys.executable))
    if os.path.exists(os.path.join(os.path.dirname(sys.executable), "python")):
        assert runmod.interpreter_for("python") == "python"


def test_no_launcher_anywhere_is_reported(monkeypatch):
    monkeypatch.setattr(mpi_locator, "_candidates", lambda environ, engine: [])
    with pytest.raises(mpi_locator.LauncherError, match="no MPI launcher"):
        mpi_locator.locate({})
