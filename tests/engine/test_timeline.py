"""The Chrome-trace timeline: from COLLECTIVES_TIMELINE at init, and from
start_timeline()/stop_timeline() at run time. The file must be a valid JSON list of trace
events with Horovod's event names, per-tensor process_name metadata, the epoch start time,
balanced and time-ordered B/E pairs per tensor, and CYCLE_START marks when asked for.
"""
import collections
import json
import os
import time

import pytest

from mpi_launch import run_workers

FUSED = [f"tl.fused.{i}" for i in range(6)]
GROUP_MEMBERS = [f"tl.group_{i + 1}of4" for i in range(4)]  # Horovod's names of a group's members
ALL_TENSORS = FUSED + GROUP_MEMBERS + ["tl.bcast", "tl.gather"]


def load_events(path):
    assert os.path.exists(path), f"no timeline written at {path}"
    with open(path) as f:
        text = f.read()
    try:
        events = json.loads(text)
    except json.JSONDecodeError as e:
        raise AssertionError(f"timeline is not valid JSON ({e}):\n{text[-2000:]}") from None
    assert isinstance(events, list), type(events)
    for e in events:
        assert isinstance(e, dict) and "ph" in e and "pid" in e, e
    return events


def tensor_pids(events):
    """{tensor name: pid} from the process_name metadata."""
    return {e["args"]["name"]: e["pid"] for e in events
            if e["ph"] == "M" and e.get("name") == "process_name" and e["pid"] != 0}


def begun(events, pid=None):
    return [e["name"] for e in events if e["ph"] == "B" and (pid is None or e["pid"] == pid)]


def check_common(events, tensors):
    names = collections.Counter(begun(events))
    for expected in ("NEGOTIATE_ALLREDUCE", "ALLREDUCE", "MPI_ALLREDUCE", "QUEUE",
                     "MEMCPY_IN_FUSION_BUFFER", "MEMCPY_OUT_FUSION_BUFFER"):
        assert names[expected] > 0, f"no {expected} event; events begun: {dict(names)}"

    # Metadata: the process names are the tensor names, and the start time is recorded.
    pids = tensor_pids(events)
    for t in tensors:
        assert t in pids, f"no process_name metadata naming '{t}'; have {sorted(pids)}"
    starts = [e["args"]["start_time_since_epoch_in_micros"] for e in events
              if e["ph"] == "M" and "start_time_since_epoch_in_micros" in e.get("args", {})]
    assert starts, "no metadata event carries start_time_since_epoch_in_micros"
    assert all(isinstance(s, int) for s in starts), starts
    now_us = time.time() * 1e6
    assert all(abs(s - now_us) < 3600 * 1e6 for s in starts), (starts, now_us)

    # B/E balanced and properly nested per pid (file order), timestamps non-decreasing.
    depth = collections.defaultdict(int)
    last_ts = collections.defaultdict(lambda: -1)
    for e in events:
        if e["ph"] not in ("B", "E"):
            continue
        pid = e["pid"]
        assert isinstance(e["ts"], (int, float)), e
        assert e["ts"] >= last_ts[pid], f"time goes backwards for pid {pid}: {e}"
        last_ts[pid] = e["ts"]
        depth[pid] += 1 if e["ph"] == "B" else -1
        assert depth[pid] >= 0, f"E without B for pid {pid}: {e}"
    unbalanced = {pid: d for pid, d in depth.items() if d}
    assert not unbalanced, f"unclosed B events per pid: {unbalanced}"

    # The grouped allreduce was fused for certain: each member went through the fusion buffer.
    for t in GROUP_MEMBERS:
        seen = begun(events, pids[t])
        for expected in ("NEGOTIATE_ALLREDUCE", "ALLREDUCE", "QUEUE", "MEMCPY_IN_FUSION_BUFFER", "MPI_ALLREDUCE",
                         "MEMCPY_OUT_FUSION_BUFFER"):
            assert expected in seen, f"'{t}' has no {expected}: {seen}"
        assert seen.index("NEGOTIATE_ALLREDUCE") < seen.index("ALLREDUCE") < seen.index("MEMCPY_IN_FUSION_BUFFER") \
            < seen.index("MPI_ALLREDUCE") < seen.index("MEMCPY_OUT_FUSION_BUFFER"), seen
    for t, op in (("tl.bcast", "BROADCAST"), ("tl.gather", "ALLGATHER")):
        seen = begun(events, pids[t])
        assert f"NEGOTIATE_{op}" in seen and op in seen, f"'{t}': {seen}"
    return names


def test_timeline_from_environment(tmp_path):
    path = str(tmp_path / "timeline.json")
    env = {"COLLECTIVES_TIMELINE": path, "COLLECTIVES_TIMELINE_MARK_CYCLES": "", "HOROVOD_TIMELINE_MARK_CYCLES": ""}
    run_workers(2, "timeline_worker.py", "env", timeout=120, env=env)
    events = load_events(path)
    names = check_common(events, ALL_TENSORS)
    assert "CYCLE_START" not in {e.get("name") for e in events}, "cycles marked though not asked for"
    assert names["NEGOTIATE_ALLREDUCE"] >= 8 * len(FUSED)


def test_timeline_start_stop_api(tmp_path):
    path = str(tmp_path / "timeline.json")
    path2 = str(tmp_path / "timeline2.json")
    env = {"COLLECTIVES_TIMELINE": "", "HOROVOD_TIMELINE": ""}
    run_workers(2, "timeline_worker.py", "api", path, path2, timeout=120, env=env)
    events = load_events(path)
    check_common(events, ALL_TENSORS)
    assert any(e.get("name") == "CYCLE_START" for e in events), "mark_cycles=True but no CYCLE_START event"
    # Nothing after stop_timeline() lands in the first file ...
    assert "tl.after.stop" not in tensor_pids(events)
    assert "tl.second" not in tensor_pids(events)
    # ... and a second start_timeline() writes a new, valid file with only what followed.
    events2 = load_events(path2)
    pids2 = tensor_pids(events2)
    assert "tl.second" in pids2 and "tl.fused.0" not in pids2, sorted(pids2)
    assert "ALLREDUCE" in begun(events2, pids2["tl.second"])
    assert not any(e.get("name") == "CYCLE_START" for e in events2), "second timeline started without mark_cycles"
    depth = collections.Counter()
    for e in events2:
        if e["ph"] in ("B", "E"):
            depth[e["pid"]] += 1 if e["ph"] == "B" else -1
    assert not +depth and not -depth, depth


def test_timeline_valid_when_exiting_without_shutdown(tmp_path):
    """The process exits without calling shutdown(): the file is still complete JSON."""
    path = str(tmp_path / "timeline.json")
    run_workers(2, "timeline_worker.py", "env_exit", timeout=120, env={"COLLECTIVES_TIMELINE": path})
    check_common(load_events(path), ALL_TENSORS)


def test_timeline_started_with_an_op_in_flight(tmp_path):
    """start_timeline() while a tensor is negotiating: no end event without its begin event,
    and the ops that follow are recorded normally."""
    path = str(tmp_path / "timeline.json")
    env = {"COLLECTIVES_TIMELINE": "", "HOROVOD_TIMELINE": ""}
    run_workers(2, "timeline_worker.py", "midflight", path, timeout=120, env=env)
    events = load_events(path)
    pids = tensor_pids(events)
    assert "tl.after" in pids and "ALLREDUCE" in begun(events, pids["tl.after"]), sorted(pids)
    depth = collections.defaultdict(int)
    for e in events:
        if e["ph"] in ("B", "E"):
            depth[e["pid"]] += 1 if e["ph"] == "B" else -1
            name = [t for t, p in pids.items() if p == e["pid"]]
            assert depth[e["pid"]] >= 0, f"end event without a begin event for {name}: {e}"
    assert not {p: d for p, d in depth.items() if d}, dict(depth)


@pytest.mark.parametrize("mark", ["1", "true"])
def test_timeline_mark_cycles_variable(tmp_path, mark):
    path = str(tmp_path / "timeline.json")
    env = {"COLLECTIVES_TIMELINE": path, "COLLECTIVES_TIMELINE_MARK_CYCLES": mark}
    run_workers(2, "timeline_worker.py", "env", timeout=120, env=env)
    events = load_events(path)
    assert any(e.get("name") == "CYCLE_START" for e in events)


def test_timeline_names_of_the_torch_face(tmp_path):
    """collectives.torch records Horovod's torch names (issue 35 item 5): the op's kind before the
    user's name (``allreduce.tt.allreduce``), ``<kind>.noname.<n>`` without one, and a group's
    members as ``<kind>.<name>_<i>of<n>``; never the bare user name."""
    pytest.importorskip("torch")
    path = str(tmp_path / "timeline.json")
    run_workers(2, "timeline_worker.py", "torch", timeout=120, env={"COLLECTIVES_TIMELINE": path})
    pids = tensor_pids(load_events(path))
    expected = ["allreduce.tt.allreduce", "grouped_allreduce.tt.group_1of2", "grouped_allreduce.tt.group_2of2",
                "allgather.tt.allgather", "broadcast.tt.broadcast", "alltoall.tt.alltoall",
                "reducescatter.tt.reducescatter"]
    missing = [t for t in expected if t not in pids]
    assert not missing, f"missing {missing}; recorded {sorted(pids)}"
    assert any(t.startswith("allreduce.noname.") for t in pids), sorted(pids)
    assert not [t for t in pids if t.startswith("tt.")], sorted(pids)


def test_timeline_names_of_the_tensorflow_face(tmp_path):
    """collectives.tensorflow records Horovod's TensorFlow names (issue 35 item 5): an unnamed op in
    a tf.function is named after its input (``HorovodAllreduce_x_0``, unique in the graph), a group
    after its first and last inputs with Horovod's member suffixes; a given name as it is."""
    pytest.importorskip("tensorflow")
    path = str(tmp_path / "timeline.json")
    env = {"COLLECTIVES_TIMELINE": path, "TF_CPP_MIN_LOG_LEVEL": "2", "TF_ENABLE_ONEDNN_OPTS": "0"}
    run_workers(2, "timeline_worker.py", "tensorflow", timeout=120, env=env)
    pids = tensor_pids(load_events(path))
    expected = ["HorovodAllreduce_x_0", "HorovodAllreduce_x_0_1", "HorovodAllgather_x_0",
                "HorovodGroupedAllreduce_x_0_mul_0_1of2", "HorovodGroupedAllreduce_x_0_mul_0_2of2", "tt.tf.named"]
    missing = [t for t in expected if t not in pids]
    assert not missing, f"missing {missing}; recorded {sorted(pids)}"
    # the eager call: the core's name
    assert any(t.startswith("allreduce.noname.") for t in pids), sorted(pids)

