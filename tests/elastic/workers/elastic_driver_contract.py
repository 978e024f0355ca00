"""A worker that follows the elastic contract by hand (no hvd.elastic): it tests the driver on
its own, with a "model" whose result is exact whatever the job's size.

The model is an int64 vector; the data set is SAMPLES integer samples (sample i is a fixed
function of i); one step consumes the next size*BATCH samples, split among the ranks, and adds
their sum to the vector (an allreduce Sum). So after all samples, on every rank, the vector
equals the sum of all samples (a numpy reference), exactly, whatever resizes happened, provided
no sample was lost or counted twice: the driver's restarts must resume from the last commit.

Contract parts done here: commits every COMMIT_EVERY steps to COLLECTIVES_ELASTIC_COMMIT_DIR
(one file per rank, atomic), the commit id +1 per commit; after a commit rank 0 asks the driver
``hosts_version <commit>``, the answer is broadcast, and a new version makes every rank exit 77;
at start the newest commit any rank holds is agreed (allgather) and broadcast from its lowest
holder; a failed collective (a collectives error) exits 78. Output: one ``RESULT {json}`` line per rank at the end.

Arguments: --die-rank R --die-step S (generation 0 only: rank R SIGKILLs itself at step S),
--die-always (every generation), --die-until G (generations 0 to G), --step-sleep SECONDS.
Each rank prints the MPICH shared-memory segments it maps (``[gen G rank R] segments: ...``),
for the tests that check the driver removes those of killed ranks.
"""
import argparse
import json
import os
import pickle
import signal
import socket
import sys
import time

import numpy as np

import collectives as hvd

SAMPLES = 480
BATCH = 4
COMMIT_EVERY = 3
DIM = 3


def sample(i):
    return np.array([i % 7 + 1, (i * 3) % 11, i], dtype=np.int64)


def commit_path(directory, rank):
    return os.path.join(directory, f"contract.rank{rank}.pkl")


def newest_local_commit(directory):
    best = None
    try:
        names = os.listdir(directory)
    except OSError:
        return None
    for name in names:
        if not (name.startswith("contract.rank") and name.endswith(".pkl")):
            continue
        try:
            with open(os.path.join(directory, name), "rb") as f:
                state = pickle.load(f)
        except (OSError, EOFError, pickle.UnpicklingError):
            continue  # a partial file cannot be here (rename is atomic), but be safe
        if best is None or state["commit"] > best["commit"]:
            best = state
    return best


def save(directory, rank, state):
    os.makedirs(directory, exist_ok=True)
    path = commit_path(directory, rank)
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "wb") as f:
        pickle.dump(state, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def mpich_segments():
    """The /dev/shm/mpich_* files this process maps (MPICH's intra-host segments)."""
    with open("/proc/self/maps") as f:
        paths = {line.split(None, 5)[-1].strip() for line in f if "/dev/shm/mpich_" in line}
    return sorted(p.removesuffix(" (deleted)") for p in paths)


def ask_driver(commit):
    host, _, port = os.environ["COLLECTIVES_ELASTIC_DRIVER"].rpartition(":")
    try:
        with socket.create_connection((host, int(port)), timeout=5) as s:
            s.sendall(f"hosts_version {commit}\n".encode())
            return int(s.makefile().readline())
    except (OSError, ValueError):
        return None


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--die-rank", type=int, default=-1)
    p.add_argument("--die-step", type=int, default=-1)
    p.add_argument("--die-always", action="store_true")
    p.add_argument("--die-until", type=int, default=0)
    p.add_argument("--step-sleep", type=float, default=0.05)
    a = p.parse_args()
    generation = int(os.environ["COLLECTIVES_ELASTIC_GENERATION"])
    my_version = int(os.environ["COLLECTIVES_ELASTIC_HOSTS_VERSION"])
    directory = os.environ["COLLECTIVES_ELASTIC_COMMIT_DIR"]
    hvd.init()
    rank, size = hvd.rank(), hvd.size()

    local = newest_local_commit(directory)
    ids = hvd.allgather_object(-1 if local is None else local["commit"])
    newest = max(ids)
    state = {"commit": 0, "processed": 0, "step": 0, "w": np.zeros(DIM, dtype=np.int64)}
    if newest >= 0:
        state = hvd.broadcast_object(local if ids[rank] == newest else None, root_rank=ids.index(newest))
    print(f"[gen {generation} rank {rank}/{size}] restored commit {state['commit']} "
          f"(processed {state['processed']})", file=sys.stderr, flush=True)
    print(f"[gen {generation} rank {rank}] segments: {' '.join(mpich_segments())}", file=sys.stderr, flush=True)

    try:
        train(a, state, directory, generation, my_version, rank, size)
    except hvd.CollectivesError as e:  # the contract's HorovodInternalError: a peer failed
        print(f"[gen {generation} rank {rank}] collective failed ({type(e).__name__}); exiting 78",
              file=sys.stderr, flush=True)
        os._exit(78)
    hvd.shutdown()


def train(a, state, directory, generation, my_version, rank, size):
    w = state["w"].copy()
    processed, step, commit = state["processed"], state["step"], state["commit"]
    while processed < SAMPLES:
        if rank == a.die_rank and step == a.die_step and (generation <= a.die_until or a.die_always):
            os.kill(os.getpid(), signal.SIGKILL)
        first = processed + rank * BATCH
        mine = [sample(i) for i in range(first, min(first + BATCH, SAMPLES))]
        local_sum = np.sum(mine, axis=0) if mine else np.zeros(DIM, dtype=np.int64)
        w += hvd.allreduce(local_sum, op=hvd.Sum, name="contract.grad")
        processed = min(SAMPLES, processed + size * BATCH)
        step += 1
        time.sleep(a.step_sleep)
        if step % COMMIT_EVERY == 0 or processed >= SAMPLES:
            commit += 1
            save(directory, rank, {"commit": commit, "processed": processed, "step": step, "w": w.copy()})
            answer = ask_driver(commit) if rank == 0 else None
            answer = hvd.broadcast_object(answer, root_rank=0)
            if answer is not None and answer != my_version and processed < SAMPLES:
                print(f"[gen {generation} rank {rank}] hosts updated at commit {commit}", file=sys.stderr, flush=True)
                hvd.shutdown()
                sys.exit(77)
    print("RESULT " + json.dumps({"rank": rank, "size": size, "generation": generation, "w": w.tolist(),
                                  "processed": processed, "commit": commit}), flush=True)


if __name__ == "__main__":
    main()
