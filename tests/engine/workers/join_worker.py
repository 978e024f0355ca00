"""join() on real ranks, checked against numpy references.

Run as: mpirun -np N python join_worker.py. Rank r trains for r + 1 steps, then joins: the
others' allreduces (fused small tensors, a large one, a grouped one; Sum and Average) must
equal the reduction over the ranks still active, with joined ranks counted as zeros, and
join() must return the last rank to join. Broadcast and allgather while a rank is joined
fail on the others. Joins repeat, and the response cache works again afterwards.
"""
import numpy as np

import collectives as hvd
from common import Checker, rank_input

hvd.init()
R, S = hvd.rank(), hvd.size()
chk = Checker(R)
SHAPES = [(3,), (5, 2), (1,), (40000,)]  # the last is too large to fuse


def step_inputs(step, rank):
    return [rank_input(1000 * step + k, rank, shape, np.float32) for k, shape in enumerate(SHAPES)]


def uneven_training(round_):
    for step in range(R + 1):
        active = [r for r in range(S) if r >= step]
        mine = step_inputs(step, R)
        handles = [hvd.allreduce_async(x, op=hvd.Sum, name=f"grad.{k}") for k, x in enumerate(mine)]
        avg = hvd.allreduce(mine[0], name="avg")
        grouped = hvd.grouped_allreduce(mine[:2], op=hvd.Sum, name="grouped")
        sums = [sum(step_inputs(step, r)[k] for r in active) for k in range(len(SHAPES))]
        for k, h in enumerate(handles):
            np.testing.assert_allclose(hvd.synchronize(h), sums[k], rtol=1e-6, err_msg=f"step {step} tensor {k}")
        np.testing.assert_allclose(avg, sums[0] / S, rtol=1e-6)  # joined ranks count in the average
        np.testing.assert_allclose(grouped[1], sums[1], rtol=1e-6)
    last = hvd.join()
    assert last == S - 1, f"join returned {last} in round {round_}"


for round_ in range(2):
    chk.check(f"uneven steps, round {round_}", lambda: uneven_training(round_))


def other_ops_fail_while_joined():
    if R == 0:
        last = hvd.join()
        assert 1 <= last < S, last
        return
    for fn in (lambda: hvd.broadcast(np.ones(3), 1, name="bc.joined"),
               lambda: hvd.allgather(np.ones(3), name="ag.joined")):
        try:
            fn()
        except hvd.TensorMismatchError as e:
            assert "join" in str(e) and "[0]" in str(e), e
        else:
            raise AssertionError("expected an error while rank 0 is joined")
    last = hvd.join()
    assert 1 <= last < S, last


chk.check("broadcast / allgather fail while a rank is joined", other_ops_fail_while_joined)


def everyone_joins_at_once():
    assert 0 <= hvd.join() < S


chk.check("all ranks join with nothing else pending", everyone_joins_at_once)


def normal_afterwards():
    for _ in range(3):
        got = hvd.allreduce(np.full(4, R, np.int64), op=hvd.Sum, name="grad.0")  # a cached name
        np.testing.assert_array_equal(got, np.full(4, S * (S - 1) // 2))
    b = hvd.broadcast(np.array([R]), S - 1, name="bc.after")
    assert b[0] == S - 1


chk.check("ops work normally after the joins", normal_afterwards)
chk.finish()
