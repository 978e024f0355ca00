"""Elastic commits and the room they need (issue 35 item 9): a commit that does not fit its
directory's filesystem is refused before anything is written, with one line naming the knob
that moves the commits elsewhere (COLLECTIVES_ELASTIC_COMMIT_BASE_DIR), and the driver and the
ranks put the commit directory where that knob says. The small filesystem is a real 1 MiB tmpfs
(root only; elsewhere the test skips, saying why), unmounted whatever happens."""
import os
import subprocess
import sys

import numpy as np
import pytest

from collectives.elastic import commit_codec, commit_store, environment


@pytest.fixture
def small_fs(tmp_path):
    mount = tmp_path / "small"
    mount.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mount)], capture_output=True,
                          text=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs (needs root): {done.stderr.strip()}")
    try:
        yield str(mount)
    finally:
        subprocess.run(["umount", "-l", str(mount)], capture_output=True)


def test_a_commit_that_does_not_fit_is_refused_before_writing_naming_the_knob(small_fs, capfd):
    directory = os.path.join(small_fs, "collectives-elastic-test")
    store = commit_store.CommitStore(directory, rank=0, generation=0)
    big = {"weights": np.arange(2 * 1024 * 1024 // 8, dtype=np.float64)}  # 2 MiB on a 1 MiB filesystem
    store.submit(1, big)
    assert store.flush(timeout=30) is False
    err = capfd.readouterr().err
    lines = [line for line in err.splitlines() if "could not write commit 1" in line]
    assert len(lines) == 1, err
    assert lines[0].startswith(f"elastic: warning: rank 0 could not write commit 1 to {directory}: it needs 2.1 MB "
                               f"and {directory} has "), lines[0]
    assert lines[0].endswith("MB free; set COLLECTIVES_ELASTIC_COMMIT_BASE_DIR to a directory with room (each job's "
                             "commits go to <it>/collectives-elastic-<job>); restarts will use an older commit"), lines[0]
    assert os.listdir(directory) == []  # nothing half-written fills the filesystem
    small = {"weights": np.arange(1000, dtype=np.float64)}
    store.submit(2, small)
    assert store.flush(timeout=30) is True
    newest = store.newest()
    assert newest is not None and newest.commit_id == 2
    _, _, obj = commit_codec.decode(commit_store.read_file(newest))
    assert np.array_equal(obj["weights"], small["weights"])


def test_the_commit_directory_follows_the_knob():
    assert environment.commit_dir_for("j1", {"COLLECTIVES_ELASTIC_COMMIT_BASE_DIR": "/scratch/c"}) == \
        "/scratch/c/collectives-elastic-j1"
    default = "/dev/shm" if os.path.isdir("/dev/shm") else None
    if default:
        assert environment.commit_dir_for("j1", {}) == "/dev/shm/collectives-elastic-j1"
    read = environment.read({"COLLECTIVES_ELASTIC": "1", "COLLECTIVES_ELASTIC_JOB_ID": "j2",
                             "HOROVOD_ELASTIC_COMMIT_BASE_DIR": "/scratch/h"})
    assert read.commit_dir == "/scratch/h/collectives-elastic-j2"
