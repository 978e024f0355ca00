"""A training-like loop under COLLECTIVES_AUTOTUNE, for tests/engine/test_autotune.py.

Every step submits the same names: allreduces of several tensors of different sizes and dtypes
(small ones fused, one too large to fuse, a group), and an allgather whose first dimension
differs by rank; every result is checked against a numpy reference computed from every rank's
inputs, on every step, while the engine changes its parameters underneath. The loop runs until
every rank sees tuning finished (an allreduce of the flag, so that all ranks stop at the same
step), then a few steps more with the final parameters.

argv: LOG_BASE MAX_STEPS. The autotune log goes to LOG_BASE.rankR for rank R, so the test can
see that only rank 0 writes one. Prints "params R <json>" with the final state and
"seen R <json>" with every distinct parameter set rank R observed (rank 0 prints them all).
"""
import json
import os
import sys

import numpy as np

rank_env = os.environ.get("PMI_RANK", os.environ.get("OMPI_COMM_WORLD_RANK", "0"))
os.environ["COLLECTIVES_AUTOTUNE_LOG"] = f"{sys.argv[1]}.rank{rank_env}"

import collectives as hvd  # noqa: E402
from collectives import autotune  # noqa: E402
from common import Checker, rank_input  # noqa: E402

MAX_STEPS = int(sys.argv[2])
AFTER = 5  # steps with the final parameters
# (name, shape, dtype, op): small ones fuse; "big" (256 KiB) is reduced in place.
TENSORS = [("a", (7,), np.float32, hvd.Average), ("b", (33, 3), np.float64, hvd.Sum),
           ("c", (100,), np.int32, hvd.Sum), ("d", (64,), np.float16, hvd.Sum), ("e", (5,), np.int64, hvd.Max),
           ("f", (1000,), np.float32, hvd.Sum), ("big", (65536,), np.float32, hvd.Average)]
GROUP = [("g0", (10,), np.float32), ("g1", (300,), np.float32), ("g2", (1,), np.float32)]


def reduce_ref(xs, op):
    stack = np.stack([x.astype(np.float64) for x in xs])
    if op is hvd.Max:
        return stack.max(axis=0)
    total = stack.sum(axis=0)
    return total / len(xs) if op is hvd.Average else total


def step(chk, r, n, t):
    seed = 1000 * t
    handles = []
    for k, (name, shape, dt, op) in enumerate(TENSORS):
        mine = rank_input(seed + k, r, shape, dt)
        handles.append((name, op, seed + k, shape, dt, hvd.allreduce_async(mine, op=op, name=f"at.{name}")))
    group_in = [rank_input(seed + 50 + k, r, shape, dt) for k, (_, shape, dt) in enumerate(GROUP)]
    grouped = hvd.grouped_allreduce(group_in, op=hvd.Sum, name="at.group")
    rows = 1 + (r + t) % 3  # differs by rank and by step
    gathered = hvd.allgather(rank_input(seed + 90, r, (rows, 4), np.int16), name="at.gather")
    for name, op, s, shape, dt, h in handles:
        got = hvd.synchronize(h)
        want = reduce_ref([rank_input(s, q, shape, dt) for q in range(n)], op)
        chk.check(f"step {t} allreduce {name}", lambda got=got, want=want, dt=dt: (
            np.testing.assert_array_equal(np.asarray(got), want.astype(dt)), None)[1])
    for k, (_, shape, dt) in enumerate(GROUP):
        want = sum(rank_input(seed + 50 + k, q, shape, dt).astype(np.float64) for q in range(n))
        chk.check(f"step {t} group {k}", lambda got=grouped[k], want=want: np.testing.assert_array_equal(got, want))
    want = np.concatenate([rank_input(seed + 90, q, (1 + (q + t) % 3, 4), np.int16) for q in range(n)])
    chk.check(f"step {t} allgather", lambda: np.testing.assert_array_equal(gathered, want))


def main():
    hvd.init()
    r, n = hvd.rank(), hvd.size()
    chk = Checker(r)
    seen = []
    t = 0
    first = autotune.state()
    chk.check("autotune enabled", lambda: assert_true(first["enabled"], first))
    after = 0
    while t < MAX_STEPS and after < AFTER:
        step(chk, r, n, t)
        s = autotune.state()
        params = {k: s[k] for k in ("fusion_threshold", "cycle_time_ms", "hierarchical_allreduce",
                                    "hierarchical_allgather")}
        if params not in seen:
            seen.append(params)
        # Every rank stops at the same step: the flag is combined across ranks.
        done = hvd.allreduce(np.array([0 if s["tuning"] else 1], np.int32), op=hvd.Min, name="at.done")[0]
        if done:
            after += 1
        t += 1
    final = autotune.state()
    chk.check("tuning finished within the steps", lambda: assert_true(not final["tuning"], (t, final)))
    everyone = hvd.allgather_object(final)
    chk.check("every rank ends with the same parameters", lambda: assert_true(
        all({k: v for k, v in e.items() if k != "best_score"} == {k: v for k, v in final.items()
                                                                  if k != "best_score"} for e in everyone),
        everyone))
    seen_everywhere = hvd.allgather_object(seen)
    if r == 0:  # one writer: lines of several ranks may interleave in mpirun's output
        for q in range(n):
            print(f"params {q} {json.dumps(everyone[q])}")
            print(f"seen {q} {json.dumps(seen_everywhere[q])}")
        print(f"steps {t}", flush=True)
    hvd.shutdown()
    chk.finish()


def assert_true(cond, what):
    assert cond, what


if __name__ == "__main__":
    main()
