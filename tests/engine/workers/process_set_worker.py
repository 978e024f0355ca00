"""Process sets on real ranks, checked against numpy references.

Run as: mpirun -np N python process_set_worker.py  (N >= 2). Registers sets at init (static)
and afterwards (dynamic): even ranks, odd ranks, and one set per rank pair; runs every op in
them (the same names in several sets at once, repeated so the response cache serves them),
checks the sets' bookkeeping, and the errors: a non-member submitting, a root outside the
set, a duplicate set, ranks disagreeing about a new set, a removed set in use, a request left
waiting in a set that is removed.
"""
import sys

import numpy as np

import collectives as hvd
from common import Checker, raises, rank_input
from mpi4py import MPI

# A set may be registered once; at np=2 even/odd/all are the only distinct sets.
STATIC = hvd.ProcessSet([0, 1]) if MPI.COMM_WORLD.Get_size() >= 3 else None
hvd.init(process_sets=[STATIC] if STATIC else None)
R, S = hvd.rank(), hvd.size()
chk = Checker(R)

EVEN = hvd.add_process_set([r for r in range(S) if r % 2 == 0])
ODD = hvd.add_process_set(r for r in range(S) if r % 2 == 1)
MINE = EVEN if R % 2 == 0 else ODD


def inputs(seed, members, shape, dtype=np.float64):
    return [rank_input(seed, r, shape, dtype) for r in members]



def registered():
    return [list(range(S)), EVEN.ranks, ODD.ranks] + ([STATIC.ranks] if STATIC else [])


def bookkeeping():
    first = 1 if STATIC is None else 2
    assert (EVEN.process_set_id, ODD.process_set_id) == (first, first + 1)
    assert MINE.included() and MINE.rank() == MINE.ranks.index(R) and MINE.size() == len(MINE.ranks)
    other = ODD if MINE is EVEN else EVEN
    assert other.included() is False
    raises(ValueError, other.rank, "not part of provided process set")  # as Horovod
    assert hvd.global_process_set.ranks == list(range(S)) and hvd.global_process_set.process_set_id == 0
    assert STATIC is None or (STATIC.process_set_id == 1 and STATIC.included() == (R < 2))


chk.check("ids, ranks, rank(), size(), included()", bookkeeping)


def every_op_in_my_set(step):
    members = MINE.ranks
    me = members.index(R)
    seed = 100 + MINE.process_set_id
    # allreduce, all reduce ops (the same names in both sets, in flight at once)
    for op, ref in [(hvd.Sum, np.sum), (hvd.Min, np.min), (hvd.Max, np.max), (hvd.Product, np.prod)]:
        xs = inputs(seed + int(op), members, (5, 3), np.int32)
        got = hvd.allreduce(xs[me], op=op, name=f"ar.{int(op)}", process_set=MINE)
        np.testing.assert_array_equal(got, ref(np.stack(xs), axis=0).astype(np.int32))
    xs = inputs(seed, members, (7,))
    got = hvd.allreduce(xs[me], name="ar.avg", process_set=MINE, prescale_factor=2.0)
    np.testing.assert_allclose(got, 2.0 * np.mean(xs, axis=0))
    # grouped (fused) allreduce
    xs = [inputs(seed + k, members, (k + 1,), np.float32) for k in range(6)]
    got = hvd.grouped_allreduce([x[me] for x in xs], op=hvd.Sum, name="grouped", process_set=MINE)
    for g, x in zip(got, xs):
        np.testing.assert_allclose(g, np.sum(x, axis=0), rtol=1e-6)
    # broadcast from each member (a global rank)
    for root in members:
        x = rank_input(seed + root, R, (4,), np.int64)
        got = hvd.broadcast(x, root, name=f"bc.{root}", process_set=MINE)
        np.testing.assert_array_equal(got, rank_input(seed + root, root, (4,), np.int64))
    # allgather with ragged first dimensions, in member order
    parts = [rank_input(seed, r, (r % 3 + 1, 2), np.float32) for r in members]
    got = hvd.allgather(parts[me], name="ag", process_set=MINE)
    np.testing.assert_array_equal(got, np.concatenate(parts))
    got = hvd.grouped_allgather([parts[me], parts[me][:, :1]], name="gag", process_set=MINE)
    np.testing.assert_array_equal(got[1], np.concatenate(parts)[:, :1])
    # alltoall with splits over the set's members
    n = len(members)
    splits = [[(s + d) % 2 + 1 for d in range(n)] for s in range(n)]
    rows = [rank_input(seed, r, (sum(splits[i]), 2), np.int16) for i, r in enumerate(members)]
    got, recv = hvd.alltoall(rows[me], splits=splits[me], name="a2a", process_set=MINE)
    expect = [rows[s][sum(splits[s][:me]):sum(splits[s][:me + 1])] for s in range(n)]
    np.testing.assert_array_equal(got, np.concatenate(expect))
    assert list(recv) == [splits[s][me] for s in range(n)]
    # reducescatter: member i keeps block i
    xs = inputs(seed, members, (2 * n + 1, 3))
    got = hvd.reducescatter(xs[me], op=hvd.Sum, name="rs", process_set=MINE)
    total = np.sum(xs, axis=0)
    counts = [(2 * n + 1) // n + (1 if i < (2 * n + 1) % n else 0) for i in range(n)]
    start = sum(counts[:me])
    np.testing.assert_allclose(got, total[start:start + counts[me]])
    # objects and barrier
    assert hvd.allgather_object(R, process_set=MINE) == members
    assert hvd.broadcast_object(("from", members[-1]) if R == members[-1] else None, members[-1],
                                process_set=MINE) == ("from", members[-1])
    hvd.barrier(process_set=MINE)
    # unnamed ops count per set: the other set makes a different number of them
    for _ in range(MINE.process_set_id):
        hvd.allreduce(np.ones(1), process_set=MINE)
    got = hvd.allreduce(np.ones(2), op=hvd.Sum)  # unnamed, global: must still line up
    np.testing.assert_array_equal(got, [S, S])


for step in range(3):  # later steps go through the response cache
    chk.check(f"every op in my set, step {step}", lambda: every_op_in_my_set(step))


def static_set():
    if STATIC is not None and R < 2:
        x = rank_input(7, R, (3,), np.float64)
        got = hvd.allreduce(x, op=hvd.Sum, name="static", process_set=STATIC)
        np.testing.assert_allclose(got, rank_input(7, 0, (3,), np.float64) + rank_input(7, 1, (3,), np.float64))
    got = hvd.allreduce(np.full(2, R, np.int64), op=hvd.Sum, name="static")  # the same name, globally
    np.testing.assert_array_equal(got, [S * (S - 1) // 2] * 2)


chk.check("static set from init(process_sets=...) beside a global op of the same name", static_set)


def pair_sets():
    # One set per neighbouring pair not registered yet; a rank may belong to two of them.
    pairs = [hvd.add_process_set([i, i + 1]) for i in range(S - 1) if [i, i + 1] not in registered()]
    for ps in pairs:
        if ps.included():
            got = hvd.allreduce(np.array([R], np.int64), op=hvd.Sum, name="pair", process_set=ps)
            assert got[0] == sum(ps.ranks), (got, ps)
    for ps in pairs:
        assert hvd.remove_process_set(ps)
        assert ps.process_set_id is None


chk.check("overlapping pair sets", pair_sets)


def errors():
    other = ODD if MINE is EVEN else EVEN
    if S > 1:
        raises(ValueError, lambda: hvd.allreduce(np.ones(2), name="nonmember", process_set=other), "not a member")
    outsider = other.ranks[0] if other.ranks else None
    if outsider is not None:
        raises(ValueError, lambda: hvd.broadcast(np.ones(2), outsider, name="badroot", process_set=MINE),
               "not a member")
    raises(ValueError, lambda: hvd.add_process_set(list(EVEN.ranks)), "already exists")
    raises(hvd.TensorMismatchError, lambda: hvd.add_process_set([0] if R == 0 else [0, R]),
           "process set members")
    raises(ValueError, lambda: hvd.add_process_set([S]), "out of range")
    raises(ValueError, lambda: hvd.allreduce(np.ones(2), process_set=hvd.ProcessSet([0])), "not registered")
    assert hvd.remove_process_set(hvd.global_process_set) is False
    raises(ValueError, lambda: hvd.add_process_set(list(range(S))), "already exists")
    if [S - 1] not in registered():
        temp = hvd.add_process_set([S - 1])
        assert temp.process_set_id is not None
        assert hvd.remove_process_set(temp) and not hvd.remove_process_set(temp)
        raises(ValueError, lambda: hvd.allreduce(np.ones(2), process_set=temp), "not registered")


chk.check("errors", errors)


def removed_while_waiting():
    # A request on a set whose other member never submits it waits in the negotiator's table; the
    # set's removal fails it on its rank (Negotiator::EndExecution), and every rank goes on.
    members = [S - 2, S - 1]
    if S < 3 or members in registered():
        return  # at np=2 every two-rank set is the whole job, which cannot be removed
    temp = hvd.add_process_set(members)
    handle = None
    if R == S - 1:
        handle = hvd.allreduce_async(np.ones(3), name="left waiting", process_set=temp)
    assert hvd.remove_process_set(temp)
    if handle is not None:
        raises(ValueError, lambda: hvd.synchronize(handle), "was removed while tensor 'left waiting")
    got = hvd.allreduce(np.array([R], np.int64), op=hvd.Sum, name="after removal")
    assert got[0] == S * (S - 1) // 2


chk.check("a removed set's waiting request fails", removed_while_waiting)


def still_working():
    got = hvd.allreduce(np.array([R], np.int64), op=hvd.Sum, name="final")
    assert got[0] == S * (S - 1) // 2
    assert hvd.remove_process_set(ODD) and hvd.remove_process_set(EVEN)
    assert STATIC is None or hvd.remove_process_set(STATIC)


chk.check("global ops and removal afterwards", still_working)
chk.finish()
