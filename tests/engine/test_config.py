"""Configuration knobs: COLLECTIVES_<NAME>, else HOROVOD_<NAME>, else the default; ours wins
when both are set; invalid values raise InvalidArgumentError naming the variable. Mostly
collectives.config.load(environ) directly (no MPI), plus end-to-end checks under mpirun."""
import json
import os

import pytest

from collectives import InvalidArgumentError, config
from mpi_launch import run_workers

# key: (suffix, text for Horovod's variable, its value, text for ours, its value)
SAMPLES = {
    "fusion_threshold": ("FUSION_THRESHOLD", "1048576", 1048576, "2048", 2048),
    "cycle_time_ms": ("CYCLE_TIME", "3.5", 3.5, "0.5", 0.5),
    "cache_capacity": ("CACHE_CAPACITY", "17", 17, "5", 5),
    "timeline_path": ("TIMELINE", "/tmp/horovod.json", "/tmp/horovod.json", "/tmp/ours.json", "/tmp/ours.json"),
    "timeline_mark_cycles": ("TIMELINE_MARK_CYCLES", "1", True, "false", False),
    "stall_check_s": ("STALL_CHECK_TIME_SECONDS", "7", 7.0, "3", 3.0),
    "stall_check_disable": ("STALL_CHECK_DISABLE", "true", True, "0", False),
    "stall_shutdown_s": ("STALL_SHUTDOWN_TIME_SECONDS", "9", 9.0, "4", 4.0),
    "init_timeout_s": ("INIT_TIMEOUT_SECONDS", "120", 120.0, "0", 0.0),
    "finalize_timeout_s": ("FINALIZE_TIMEOUT_SECONDS", "600", 600.0, "0", 0.0),
    "log_level": ("LOG_LEVEL", "debug", "debug", "error", "error"),
    "framework_threads": ("FRAMEWORK_THREADS", "3", 3, "auto", None),
    "buffer_pool_bytes": ("BUFFER_POOL_BYTES", "8388608", 8388608, "0", 0),
    "hierarchical_allreduce": ("HIERARCHICAL_ALLREDUCE", "1", True, "off", False),
    "hierarchical_allgather": ("HIERARCHICAL_ALLGATHER", "yes", True, "0", False),
    "shm_allreduce": ("SHM_ALLREDUCE", "0", False, "on", True),
    "cma_allreduce": ("CMA_ALLREDUCE", "off", False, "1", True),
    "shm_negotiation": ("SHM_NEGOTIATION", "off", False, "1", True),
    "caller_cycles": ("CALLER_CYCLES", "0", False, "on", True),
    "gpu_fusion_wait": ("GPU_FUSION_WAIT", "no", False, "1", True),
    "gpu_fusion_wait_ms": ("GPU_FUSION_WAIT_MS", "20", 20.0, "0.5", 0.5),
    "tensorflow_kernels": ("TENSORFLOW_KERNELS", "0", False, "yes", True),
    "overlap_min_bytes": ("OVERLAP_MIN_BYTES", "4096", 4096, "0", 0),
    "autotune": ("AUTOTUNE", "1", True, "off", False),
    "autotune_log": ("AUTOTUNE_LOG", "/tmp/horovod.csv", "/tmp/horovod.csv", "/tmp/ours.csv", "/tmp/ours.csv"),
    "autotune_warmup_samples": ("AUTOTUNE_WARMUP_SAMPLES", "5", 5, "0", 0),
    "autotune_steps_per_sample": ("AUTOTUNE_STEPS_PER_SAMPLE", "20", 20, "2", 2),
    "autotune_bayes_opt_max_samples": ("AUTOTUNE_BAYES_OPT_MAX_SAMPLES", "30", 30, "8", 8),
    "autotune_gaussian_process_noise": ("AUTOTUNE_GAUSSIAN_PROCESS_NOISE", "0.2", 0.2, "0.9", 0.9),
    "elastic_commit_base_dir": ("ELASTIC_COMMIT_BASE_DIR", "/scratch/h", "/scratch/h", "/scratch/c", "/scratch/c"),
    "latency_stages": ("LATENCY_STAGES", "1", True, "off", False),
    "gpu_copy_kernel": ("GPU_COPY_KERNEL", "0", False, "yes", True),
    "nccl_library": ("NCCL_LIBRARY", "/h/libnccl.so.2", "/h/libnccl.so.2", "libnccl.so.2", "libnccl.so.2"),
}
CONFIGURATION_PAGE = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "docs",
                                  "configuration.md")


def test_every_knob_has_a_sample():
    assert set(SAMPLES) == set(config.KNOBS)
    for key, (suffix, *_rest) in SAMPLES.items():
        assert config.KNOBS[key].env == "COLLECTIVES_" + suffix
        assert config.KNOBS[key].horovod_env == "HOROVOD_" + suffix


def test_the_configuration_page_lists_every_knob_and_no_other():
    import re
    with open(CONFIGURATION_PAGE) as f:
        listed = set(re.findall(r"^\| `(COLLECTIVES_[A-Z0-9_]+)` \|", f.read(), re.M))
    assert listed == {knob.env for knob in config.KNOBS.values()}


def test_engine_environment_is_written_back_in_one_spelling():
    environ = {"HOROVOD_LATENCY_STAGES": "yes", "COLLECTIVES_GPU_COPY_KERNEL": "off"}
    config.export_engine_environment(config.load(environ), environ)
    assert environ["COLLECTIVES_LATENCY_STAGES"] == "1" and environ["COLLECTIVES_GPU_COPY_KERNEL"] == "0"
    environ = {}
    config.export_engine_environment(config.load(environ), environ)
    assert environ == {"COLLECTIVES_LATENCY_STAGES": "0", "COLLECTIVES_GPU_COPY_KERNEL": "1"}


def test_defaults_with_empty_environment():
    values = config.load({})
    for key, knob in config.KNOBS.items():
        assert values[key] == knob.default, key
    assert values["fusion_threshold"] == 128 * 1024 * 1024
    assert values["stall_check_s"] == 60.0
    assert values["stall_shutdown_s"] == 1800.0  # torch.distributed's default timeout: no hang by default
    assert values["cache_capacity"] == 1024
    assert values["buffer_pool_bytes"] == 32 * 1024 * 1024  # small: idle host buffers kept for reuse


@pytest.mark.parametrize("key", list(SAMPLES))
def test_horovod_variable_is_the_fallback(key):
    suffix, h_text, h_value, _, _ = SAMPLES[key]
    values = config.load({"HOROVOD_" + suffix: h_text})
    assert values[key] == h_value
    assert config.read(key, {"HOROVOD_" + suffix: h_text}) == h_value


@pytest.mark.parametrize("key", list(SAMPLES))
def test_our_variable_wins_when_both_set(key):
    suffix, h_text, _, c_text, c_value = SAMPLES[key]
    env = {"HOROVOD_" + suffix: h_text, "COLLECTIVES_" + suffix: c_text}
    assert config.load(env)[key] == c_value
    assert config.read(key, env) == c_value


def test_our_variable_alone():
    env = {"COLLECTIVES_" + s[0]: s[3] for s in SAMPLES.values()}
    values = config.load(env)
    for key, s in SAMPLES.items():
        if key == "stall_check_s":
            continue
        assert values[key] == s[4], key


def test_stall_check_disable_turns_the_check_off():
    assert config.load({"HOROVOD_STALL_CHECK_DISABLE": "1", "HOROVOD_STALL_CHECK_TIME_SECONDS": "5"})["stall_check_s"] == 0
    assert config.load({"COLLECTIVES_STALL_CHECK_DISABLE": "0", "HOROVOD_STALL_CHECK_DISABLE": "1",
                        "COLLECTIVES_STALL_CHECK_TIME_SECONDS": "5"})["stall_check_s"] == 5.0


def test_our_valid_value_shadows_an_invalid_horovod_value():
    values = config.load({"COLLECTIVES_FUSION_THRESHOLD": "4096", "HOROVOD_FUSION_THRESHOLD": "lots"})
    assert values["fusion_threshold"] == 4096


def test_engine_config_has_the_engine_knobs():
    values = config.load({"HOROVOD_FUSION_THRESHOLD": "77", "COLLECTIVES_STALL_SHUTDOWN_TIME_SECONDS": "2"})
    engine = config.engine_config(values)
    assert engine["fusion_threshold"] == 77 and engine["stall_shutdown_s"] == 2.0
    assert "log_level" not in engine
    assert config.engine_config(config.load({"HOROVOD_BUFFER_POOL_BYTES": "4096"}))["buffer_pool_bytes"] == 4096


INVALID = [
    ("COLLECTIVES_FUSION_THRESHOLD", "abc"),
    ("HOROVOD_FUSION_THRESHOLD", "64MB"),
    ("COLLECTIVES_FUSION_THRESHOLD", "-1"),
    ("HOROVOD_FUSION_THRESHOLD", "-1024"),
    ("COLLECTIVES_CYCLE_TIME", "fast"),
    ("HOROVOD_CYCLE_TIME", "-2.5"),
    ("COLLECTIVES_CYCLE_TIME", "nan"),
    ("COLLECTIVES_CACHE_CAPACITY", "1.5"),
    ("HOROVOD_CACHE_CAPACITY", "-5"),
    ("COLLECTIVES_TIMELINE_MARK_CYCLES", "maybe"),
    ("HOROVOD_TIMELINE_MARK_CYCLES", "2"),
    ("COLLECTIVES_STALL_CHECK_TIME_SECONDS", "soon"),
    ("COLLECTIVES_STALL_CHECK_DISABLE", "sometimes"),
    ("HOROVOD_STALL_SHUTDOWN_TIME_SECONDS", "x"),
    ("COLLECTIVES_INIT_TIMEOUT_SECONDS", "-1"),
    ("HOROVOD_INIT_TIMEOUT_SECONDS", "inf"),
    ("COLLECTIVES_LOG_LEVEL", "verbose"),
    ("HOROVOD_LOG_LEVEL", "loud"),
    ("COLLECTIVES_BUFFER_POOL_BYTES", "-1"),
    ("HOROVOD_BUFFER_POOL_BYTES", "32MiB"),
]


@pytest.mark.parametrize("variable,text", INVALID)
def test_invalid_value_names_the_variable(variable, text):
    with pytest.raises(InvalidArgumentError) as info:
        config.load({variable: text})
    assert isinstance(info.value, ValueError)
    assert variable in str(info.value), f"message does not name {variable}: {info.value}"


def test_invalid_ours_is_reported_even_with_valid_horovod():
    with pytest.raises(InvalidArgumentError) as info:
        config.load({"COLLECTIVES_CACHE_CAPACITY": "many", "HOROVOD_CACHE_CAPACITY": "10"})
    assert "COLLECTIVES_CACHE_CAPACITY" in str(info.value)


def test_load_reads_os_environ_by_default(monkeypatch):
    monkeypatch.delenv("COLLECTIVES_CACHE_CAPACITY", raising=False)
    monkeypatch.setenv("HOROVOD_CACHE_CAPACITY", "33")
    assert config.load()["cache_capacity"] == 33
    monkeypatch.setenv("COLLECTIVES_CACHE_CAPACITY", "44")
    assert config.load()["cache_capacity"] == 44


# ----------------------------------------------------------------- end to end (mpirun)

def _timeline_names(path):
    with open(path) as f:
        events = json.load(f)
    return {e.get("name") for e in events if e.get("ph") == "B"}


def test_horovod_variables_reach_the_engine(tmp_path):
    """HOROVOD_TIMELINE names the file and HOROVOD_FUSION_THRESHOLD=0 turns fusion off."""
    path = str(tmp_path / "hvd.json")
    env = {"COLLECTIVES_TIMELINE": "", "HOROVOD_TIMELINE": path,
           "COLLECTIVES_FUSION_THRESHOLD": "", "HOROVOD_FUSION_THRESHOLD": "0",
           "COLLECTIVES_TIMELINE_MARK_CYCLES": "", "HOROVOD_TIMELINE_MARK_CYCLES": ""}
    run_workers(2, "timeline_worker.py", "env", timeout=120, env=env)
    names = _timeline_names(path)
    assert "MPI_ALLREDUCE" in names
    assert "MEMCPY_IN_FUSION_BUFFER" not in names, "fusion happened with HOROVOD_FUSION_THRESHOLD=0"


def test_our_variables_win_in_the_engine(tmp_path):
    ours, theirs = str(tmp_path / "ours.json"), str(tmp_path / "theirs.json")
    env = {"COLLECTIVES_TIMELINE": ours, "HOROVOD_TIMELINE": theirs,
           "COLLECTIVES_FUSION_THRESHOLD": "1048576", "HOROVOD_FUSION_THRESHOLD": "0"}
    run_workers(2, "timeline_worker.py", "env", timeout=120, env=env)
    assert not os.path.exists(theirs), "HOROVOD_TIMELINE used although COLLECTIVES_TIMELINE is set"
    assert "MEMCPY_IN_FUSION_BUFFER" in _timeline_names(ours), "COLLECTIVES_FUSION_THRESHOLD did not win"


@pytest.mark.parametrize("variable,text", [("COLLECTIVES_FUSION_THRESHOLD", "big"), ("HOROVOD_CYCLE_TIME", "soon")])
def test_init_rejects_invalid_environment(variable, text):
    env = {variable: text}
    run = run_workers(1, "config_worker.py", variable, timeout=120, env=env)
    assert "[rank 0] 2 passed, 0 failed" in run.stdout, run.describe()
