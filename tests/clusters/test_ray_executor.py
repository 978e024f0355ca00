"""collectives.ray.RayExecutor on one machine, after a bare ``ray.init()`` (what a user tries
first): 2 ranks as Ray actors, their MPI world formed through MPICH's proxies in the actors.

One Ray instance and one started executor serve the module (Ray's start costs ~8-15 s here);
the worker-kill test ends that executor, and the elastic test, last, has the CPUs to itself.
Cost on this 2-core machine: about 3 min (175 s at load 15).
"""
import os
import signal
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from ray_support import (alive_actors, hard_timeout, ray_missing_reason, ray_sessions, remove_new_sessions,
                         wait_until_no_ray_processes)

pytestmark = pytest.mark.skipif(ray_missing_reason() is not None, reason=str(ray_missing_reason()))
HERE = os.path.dirname(os.path.abspath(__file__))
STEPS = 4


def test_without_ray_init_start_says_so_and_starts_a_local_ray():
    """First in the module (before its own Ray starts): a script that never calls ray.init()."""
    code = textwrap.dedent("""
        import numpy as np, ray
        from collectives.ray import RayExecutor
        ex = RayExecutor(RayExecutor.create_settings(timeout_s=90), num_workers=2)
        ex.start()
        def total():
            import collectives as hvd
            return float(hvd.allreduce(np.ones(1), op=hvd.Sum)[0])
        print("RESULT", ex.run(total))
        ex.shutdown()
        ray.shutdown()
    """)
    sessions = ray_sessions()
    try:
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=240)
    finally:
        left = wait_until_no_ray_processes()
        remove_new_sessions(sessions)
    assert "RESULT [2.0, 2.0]" in out.stdout, out
    line = ("collectives.ray: RayExecutor.start(): Ray is not initialised; starting a local Ray instance "
            "(ray.init()). To use a cluster, call ray.init(address='auto')")
    assert line in out.stderr, out.stderr
    assert not left, f"Ray processes left: {left}"


@pytest.fixture(scope="module")
def ray_session():
    import ray
    assert not wait_until_no_ray_processes(5), "Ray processes of this venv were running before the test"
    sessions = ray_sessions()
    with hard_timeout(120, "ray.init()"):
        ray.init()  # bare: a local instance of this machine's CPUs
    try:
        yield ray
    finally:
        ray.shutdown()
        left = wait_until_no_ray_processes()
        remove_new_sessions(sessions)
        assert not left, f"Ray processes left after ray.shutdown(): {left}"


@pytest.fixture(scope="module")
def executor(ray_session):
    from collectives.ray import RayExecutor

    class Tagged:
        """execute()'s executable: made in every rank after extra_env_vars are set."""
        def __init__(self, tag):
            self.tag = tag
            self.env = os.environ.get("RAY_TEST_VARIABLE")

    ex = RayExecutor(RayExecutor.create_settings(timeout_s=90), num_workers=2)
    with hard_timeout(180, "RayExecutor.start()"):
        ex.start(executable_cls=Tagged, executable_args=["made"], extra_env_vars={"RAY_TEST_VARIABLE": "set"})
    try:
        yield ex
    finally:
        with hard_timeout(60, "RayExecutor.shutdown()"):
            ex.shutdown()
        assert not alive_actors(), f"actors alive after shutdown(): {alive_actors()}"


def _allreduce(scale, offset=0.0):
    import collectives as hvd
    hvd.init()  # a no-op: the rank's engine is started already (Horovod's examples call it)
    mine = np.arange(5.0) * (hvd.rank() + 1) * scale + offset
    return hvd.rank(), hvd.allreduce(mine, op=hvd.Sum)


def test_ranks_are_actors_with_the_topology_of_one_machine(executor):
    topology = executor.topology
    assert [t["rank"] for t in topology] == [0, 1]
    assert all(t["size"] == 2 and t["local_size"] == 2 and t["cross_size"] == 1 and t["cross_rank"] == 0
               for t in topology), topology
    assert [t["local_rank"] for t in topology] == [0, 1]
    assert len({t["pid"] for t in topology}) == 2


def test_run_and_run_remote_give_every_ranks_result(executor):
    import ray
    expected = sum(np.arange(5.0) * (r + 1) * 2.0 + 1.0 for r in range(2))
    with hard_timeout(60, "run()"):
        results = executor.run(_allreduce, args=[2.0], kwargs={"offset": 1.0})
        refs = executor.run_remote(_allreduce, args=[2.0], kwargs={"offset": 1.0})
        remote = ray.get(refs, timeout=60)
    for got in (results, remote):
        assert [r for r, _ in got] == [0, 1]
        for _, total in got:
            np.testing.assert_array_equal(total, expected)


def test_execute_gets_the_executable_made_after_the_environment(executor):
    with hard_timeout(60, "execute()"):
        assert executor.execute(lambda w: (w.tag, w.env)) == [("made", "set")] * 2
        assert executor.execute_single(lambda w: w.tag) == "made"


def test_an_exception_on_a_rank_is_raised_with_its_rank(executor):
    def fail_on_one():
        import collectives as hvd
        if hvd.rank() == 1:
            raise ValueError("bad input on this rank")
        return hvd.rank()
    with hard_timeout(60, "run()"), pytest.raises(ValueError, match="bad input on this rank") as info:
        executor.run(fail_on_one)
    assert any("raised on rank 1" in note for note in getattr(info.value, "__notes__", [])), info.value
    with hard_timeout(60, "run()"):
        assert [r for r, _ in executor.run(_allreduce, args=[1.0])] == [0, 1]  # the world goes on


def test_no_room_for_the_workers_is_one_line_within_the_placement_timeout(ray_session, executor):
    from collectives.ray import RayExecutor, RayStartTimeout
    too_many = RayExecutor(RayExecutor.create_settings(timeout_s=30, placement_group_timeout_s=2), num_workers=3)
    with hard_timeout(60, "start()"), pytest.raises(RayStartTimeout) as info:
        too_many.start()
    assert str(info.value).startswith("Ray could not place 3 workers (3 bundles of {'CPU': 1}, PACK) within 2 s "
                                      "(placement_group_timeout_s); the cluster has "), info.value
    assert "\n" not in str(info.value)
    assert len(alive_actors()) == 2  # the module's executor's, no more


def test_torch_training_equals_single_process(executor):
    from ray_training import numpy_reference, torch_train
    w_ref, b_ref = numpy_reference(STEPS)
    with hard_timeout(120, "torch training"):
        results = executor.run(torch_train, args=[STEPS])
    assert [(r[2], r[3]) for r in results] == [(0, 2), (1, 2)]
    for w, b, _, _ in results:
        np.testing.assert_allclose(w, w_ref, rtol=1e-12, atol=1e-12)
        np.testing.assert_allclose(b, b_ref, rtol=1e-12, atol=1e-12)
    assert not np.allclose(w_ref, numpy_reference(0)[0])  # the steps changed the weights


def test_keras_training_equals_single_process(executor):
    from ray_training import keras_train, numpy_reference
    w_ref, b_ref = numpy_reference(STEPS)
    with hard_timeout(180, "Keras training"):
        results = executor.run(keras_train, args=[STEPS])
    assert [(r[2], r[3]) for r in results] == [(0, 2), (1, 2)]
    for w, b, _, _ in results:
        np.testing.assert_allclose(w, w_ref, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(b, b_ref, rtol=1e-5, atol=1e-6)


def _allreduce_until_killed():
    import time
    import collectives as hvd
    for _ in range(100000):
        hvd.allreduce(np.ones(100), name="beat")
        time.sleep(0.01)


def test_a_killed_worker_ends_run_with_one_error_and_no_actor_left(ray_session, executor):
    """Runs last on the module's executor: the worker of rank 1 is killed mid-job."""
    import time
    from collectives.ray import NotStartedError, WorkerLostError
    victim = executor.workers.infos[1]
    with hard_timeout(120, "run() with a killed worker"):
        refs = executor.run_remote(_allreduce_until_killed)
        time.sleep(2)
        os.kill(victim["pid"], signal.SIGKILL)
        with pytest.raises(WorkerLostError) as info:
            executor._collect(refs, "run()")  # what run() does with its refs
    error = info.value
    assert (error.rank, error.node) == (1, victim["node_ip"]), error
    assert f"worker rank 1 (Ray actor {victim['actor_id'][:12]}, pid {victim['pid']}, on node {victim['node_ip']}) " \
           "was lost" in str(error)
    assert "\n" not in str(error)
    assert not alive_actors(), f"actors alive after the loss: {alive_actors()}"
    with pytest.raises(NotStartedError, match="call start"):
        executor.run(_allreduce, args=[1.0])


def test_without_ray_the_import_names_the_extra():
    code = textwrap.dedent("""
        import sys
        sys.modules["ray"] = None  # as if Ray were not installed
        try:
            import collectives.ray
        except ImportError as e:
            print(e)
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert "pip install 'collectives[ray]'" in out.stdout, out


def _kill_one_worker_at_commit(elastic, commit, pids_before):
    """In a thread: once the job has reached ``commit`` (as its ranks report it to the driver),
    SIGKILL the newest rank actor the elastic job made."""
    import threading
    import time

    def kill():
        deadline = time.monotonic() + 180
        while (elastic.server is not None and (elastic.server.commit() or 0) < commit
               and time.monotonic() < deadline):
            time.sleep(0.2)
        from ray_support import alive_actor_pids
        mine = [p for p in alive_actor_pids() if p not in pids_before]
        if mine:
            os.kill(max(mine), signal.SIGKILL)
    thread = threading.Thread(target=kill, daemon=True)
    thread.start()
    return thread


def test_elastic_executor_restarts_from_the_last_commit_after_a_worker_is_killed(ray_session, executor):
    """Last in the module: the module's executor is shut down first, to free the CPUs."""
    from collectives.ray import ElasticRayExecutor
    from ray_support import alive_actor_pids
    from ray_training import ELASTIC_ROWS, numpy_reference, torch_elastic_train
    executor.shutdown()
    steps = 12
    elastic = ElasticRayExecutor(ElasticRayExecutor.create_settings(timeout_s=90), min_workers=1, max_workers=2)
    elastic.start()
    killer = _kill_one_worker_at_commit(elastic, 4, set(alive_actor_pids()))
    try:
        with hard_timeout(240, "ElasticRayExecutor.run()"):
            results = elastic.run(torch_elastic_train, args=[steps, 0.5])
    finally:
        elastic.shutdown()
    killer.join()
    w_ref, b_ref = numpy_reference(steps, rows=ELASTIC_ROWS)
    assert [(r[2], r[3]) for r in results] == [(0, 2), (1, 2)]
    generation, started = {r[4] for r in results}, {r[5] for r in results}
    assert generation == {1}, f"the job was not restarted once: generations {generation}"
    assert len(started) == 1 and 0 < started.pop() < steps, f"generation 1 did not resume from a commit: {results}"
    for w, b, *_ in results:
        np.testing.assert_allclose(w, w_ref, rtol=1e-12, atol=1e-12)
        np.testing.assert_allclose(b, b_ref, rtol=1e-12, atol=1e-12)
    assert not alive_actors(), f"actors alive after the elastic job: {alive_actors()}"
