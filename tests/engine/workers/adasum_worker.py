"""op=Adasum on real ranks, checked against the numpy reference of adasum_reference.py.

Usage: adasum_worker.py FAMILY [FAMILY ...]

Families:
  numpy    allreduce / allreduce_ / allreduce_async with op=Adasum for float16, float32 and
           float64 (odd sizes, fewer elements than ranks, a tensor too large to fuse), a fused
           group of tensors of different sizes (each combined on its own: an orthogonal one
           sums and a parallel one averages in the same group), scale factors, zero inputs, a
           joined rank (contributes zeros); refusals: int32 and bfloat16 (UnsupportedTypeError),
           reducescatter (InvalidArgumentError), a process set (NotSupportedError).
  torch    collectives.torch allreduce / grouped_allreduce / allreduce_ with op=Adasum, and
           the gradient of the differentiable allreduce (the Adasum of the upstream gradients).
  optim    torch DistributedOptimizer(op=Adasum) against a numpy re-implementation of
           Horovod's delta optimizer (adasum_optim_checks.py).
  refused  on a non-power-of-two number of ranks: every verb and the optimizer raise
           NotSupportedError, a NotImplementedError, on every rank.
"""
import sys

import numpy as np

import collectives as hvd
from adasum_reference import TOLERANCE, adasum, assert_close
from common import BFLOAT16, Checker

hvd.init()
R, S = hvd.rank(), hvd.size()
chk = Checker(R)
FLOATS = [np.dtype(np.float16), np.dtype(np.float32), np.dtype(np.float64)]
SHAPES = [(5,), (3, 4), (1,), (33,), (20000,)]  # (20000,) float32/64 is over the 64 KiB fusion bound


def rank_vector(seed, rank, shape, dtype):
    """Rank ``rank``'s input for case ``seed``: normal values with a rank-dependent mean, so the
    ranks' vectors are neither orthogonal nor parallel."""
    rng = np.random.default_rng([seed, rank])
    return (rng.standard_normal(shape) + 0.3 * (rank + 1)).astype(dtype)


def expect(exc_type, fn, *words):
    try:
        fn()
    except exc_type as e:
        for w in words:
            assert w in str(e), f"{w!r} not in {e}"
        return e
    raise AssertionError(f"no {exc_type.__name__} raised")


# ---------------------------------------------------------------- numpy

def numpy_single():
    for d, dtype in enumerate(FLOATS):
        for s, shape in enumerate(SHAPES):
            seed = 100 * d + s
            mine = rank_vector(seed, R, shape, dtype)
            want = adasum([rank_vector(seed, r, shape, dtype) for r in range(S)], dtype)
            got = hvd.allreduce(mine, op=hvd.Adasum, name=f"single.{dtype}.{s}")
            assert got.dtype == dtype and got.shape == shape, (got.dtype, got.shape)
            assert_close(got, want, TOLERANCE[dtype], f"{dtype} {shape}")
            np.testing.assert_array_equal(mine, rank_vector(seed, R, shape, dtype))  # input untouched


def numpy_inplace_and_async():
    mine = rank_vector(7, R, (17,), np.float32)
    want = adasum([rank_vector(7, r, (17,), np.float32) for r in range(S)], np.float32)
    buf = mine.copy()
    hvd.allreduce_(buf, op=hvd.Adasum, name="inplace")
    assert_close(buf, want, TOLERANCE[buf.dtype], "allreduce_")
    handle = hvd.allreduce_async(mine, op=hvd.Adasum, name="async")
    assert_close(hvd.synchronize(handle), want, TOLERANCE[buf.dtype], "allreduce_async")


def numpy_fused_group():
    """One grouped request of tensors of different sizes (fused into one buffer): each tensor
    has its own dot products. Orthogonal vectors must sum and parallel ones average in the
    same group, which a dot product over the whole buffer would get wrong."""
    sizes = [1, 7, 33, 100, 1000, 0]
    for dtype in FLOATS:
        mine = [rank_vector(50 + k, R, (n,), dtype) for k, n in enumerate(sizes)]
        orthogonal = np.zeros(3 * S, dtype)
        orthogonal[3 * R:3 * R + 3] = R + 1  # disjoint supports
        parallel = (np.arange(1, 13) * (R + 1)).astype(dtype)
        got = hvd.grouped_allreduce(mine + [orthogonal, parallel], op=hvd.Adasum, name=f"group.{dtype}")
        for k, n in enumerate(sizes):
            want = adasum([rank_vector(50 + k, r, (n,), dtype) for r in range(S)], dtype)
            if n == 0:
                assert got[k].shape == (0,)
            else:
                assert_close(got[k], want, TOLERANCE[dtype], f"group {dtype} tensor {k}")
        all_orth = [np.where((np.arange(3 * S) // 3) == r, r + 1, 0) for r in range(S)]
        assert_close(got[-2], np.sum(all_orth, axis=0), TOLERANCE[dtype], "orthogonal: sum")
        assert_close(got[-1], np.arange(1, 13) * (S + 1) / 2, TOLERANCE[dtype], "parallel: average")


def numpy_scaled_and_zero():
    mine = rank_vector(9, R, (40,), np.float64)
    per_rank = [rank_vector(9, r, (40,), np.float64) for r in range(S)]
    got = hvd.allreduce(mine, op=hvd.Adasum, prescale_factor=0.5, postscale_factor=3.0, name="scaled")
    assert_close(got, 3.0 * adasum([0.5 * v for v in per_rank]), 1e-13, "prescale 0.5, postscale 3")
    # Zeros are neutral (a zero norm keeps the other vector as it is).
    zero_first = [np.zeros(40) if r == 0 else v for r, v in enumerate(per_rank)]
    got = hvd.allreduce(zero_first[R], op=hvd.Adasum, name="zero")
    assert_close(got, adasum(zero_first), 1e-13, "rank 0 zeros")


def numpy_joined_rank():
    """The last rank joins; the others' Adasum allreduces (one fused pair, one large) count it
    as zeros, the same algorithm running on every rank."""
    shapes = [(6,), (9,), (20000,)]
    if R == S - 1:
        assert 0 <= hvd.join() < S
        return
    hs = [hvd.allreduce_async(rank_vector(70 + k, R, sh, np.float32), op=hvd.Adasum, name=f"joined.{k}")
          for k, sh in enumerate(shapes)]
    for k, (h, sh) in enumerate(zip(hs, shapes)):
        per_rank = [rank_vector(70 + k, r, sh, np.float32) if r < S - 1 else np.zeros(sh, np.float32)
                    for r in range(S)]
        assert_close(hvd.synchronize(h), adasum(per_rank, np.float32), TOLERANCE[np.dtype(np.float32)],
                     f"joined tensor {k}")
    assert 0 <= hvd.join() < S


def numpy_refusals():
    expect(hvd.UnsupportedTypeError, lambda: hvd.allreduce(np.ones(4, np.int32), op=hvd.Adasum, name="bad.int"),
           "Adasum", "int32", "bad.int")
    expect(hvd.UnsupportedTypeError,
           lambda: hvd.allreduce(np.ones(4, BFLOAT16), op=hvd.Adasum, name="bad.bf16"), "bfloat16")
    expect(hvd.InvalidArgumentError,
           lambda: hvd.reducescatter(np.ones((S, 2), np.float32), op=hvd.Adasum, name="bad.rs"), "Adasum")
    # Only rank 0 submits a bad dtype; the others' float32 request under that name fails too.
    dtype = np.int32 if R == 0 else np.float32
    e = expect(hvd.CollectivesError, lambda: hvd.allreduce(np.ones(4, dtype), op=hvd.Adasum, name="bad.mixed"),
               "int32")
    assert R != 0 or isinstance(e, hvd.UnsupportedTypeError), type(e)


def numpy_process_set():
    members = [0, 1] if S > 2 else [0]  # a set other than the global one
    ps = hvd.add_process_set(members)
    try:
        if R in members:
            e = expect(hvd.errors.NotSupportedError,
                       lambda: hvd.allreduce(np.ones(4, np.float32), op=hvd.Adasum, name="set", process_set=ps),
                       "process set")
            assert isinstance(e, NotImplementedError)
    finally:
        hvd.remove_process_set(ps)


# ---------------------------------------------------------------- torch

def torch_verbs():
    import torch
    import collectives.torch as thvd

    for dtype in (torch.float16, torch.float32, torch.float64):
        npd = np.dtype(str(dtype).split(".")[1])
        mine = rank_vector(200, R, (11, 3), npd)
        want = adasum([rank_vector(200, r, (11, 3), npd) for r in range(S)], npd)
        got = thvd.allreduce(torch.from_numpy(mine), op=thvd.Adasum, name=f"torch.{npd}")
        assert got.dtype == dtype
        assert_close(got.numpy(), want, TOLERANCE[npd], f"torch allreduce {dtype}")
        t = torch.from_numpy(mine.copy())
        thvd.allreduce_(t, op=thvd.Adasum, name=f"torch_.{npd}")
        assert_close(t.numpy(), want, TOLERANCE[npd], f"torch allreduce_ {dtype}")
    group = [torch.from_numpy(rank_vector(210 + k, R, (n,), np.float32)) for k, n in enumerate((3, 30, 300))]
    got = thvd.grouped_allreduce(group, op=thvd.Adasum, name="torch.group")
    for k, n in enumerate((3, 30, 300)):
        want = adasum([rank_vector(210 + k, r, (n,), np.float32) for r in range(S)], np.float32)
        assert_close(got[k].numpy(), want, TOLERANCE[np.dtype(np.float32)], f"torch group {k}")


def torch_gradient():
    """Horovod's gradient of an allreduce is the same allreduce of the upstream gradient."""
    import torch
    import collectives.torch as thvd

    x = torch.from_numpy(rank_vector(220, R, (8,), np.float64)).requires_grad_()
    y = thvd.allreduce(x, op=thvd.Adasum, name="torch.grad")
    upstream = rank_vector(221, R, (8,), np.float64)
    y.backward(torch.from_numpy(upstream))
    want = adasum([rank_vector(221, r, (8,), np.float64) for r in range(S)])
    assert_close(x.grad.numpy(), want, 1e-13, "gradient")


# ---------------------------------------------------------------- refused rank counts

def refused_everywhere():
    import torch
    import collectives.torch as thvd

    words = ("non-power of 2", f"{S} ranks")
    e = expect(hvd.errors.NotSupportedError, lambda: hvd.allreduce(np.ones(4), op=hvd.Adasum, name="np3"), *words)
    assert isinstance(e, NotImplementedError)
    expect(NotImplementedError, lambda: hvd.grouped_allreduce([np.ones(2), np.ones(3)], op=hvd.Adasum,
                                                              name="np3.group"), *words)
    expect(NotImplementedError, lambda: thvd.allreduce(torch.ones(4), op=thvd.Adasum, name="np3.torch"), *words)
    # The optimizer reduces from the backward pass, where the refusal surfaces (as in Horovod).
    model = torch.nn.Linear(3, 1)
    opt = thvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                    named_parameters=model.named_parameters(), op=thvd.Adasum)
    before = [p.detach().clone() for p in model.parameters()]
    expect(NotImplementedError, lambda: model(torch.ones(2, 3)).sum().backward(), *words)
    for p, b in zip(model.parameters(), before):  # the parameter refused is given its value back
        assert torch.equal(p.detach(), b), (p, b)
    # Nothing is left pending: the engine still works.
    np.testing.assert_allclose(hvd.allreduce(np.ones(3), op=hvd.Sum, name="after"), np.full(3, S))


FAMILIES = {
    "numpy": [("numpy single tensors", numpy_single), ("numpy in place / async", numpy_inplace_and_async),
              ("numpy fused group", numpy_fused_group), ("numpy scale factors and zeros", numpy_scaled_and_zero),
              ("numpy joined rank", numpy_joined_rank), ("numpy refusals", numpy_refusals),
              ("numpy process set refused", numpy_process_set)],
    "torch": [("torch verbs", torch_verbs), ("torch gradient", torch_gradient)],
    "refused": [("non-power-of-two refused", refused_everywhere)],
}

for family in sys.argv[1:]:
    if family == "optim":
        from adasum_optim_checks import CHECKS

        for label, fn in CHECKS:
            chk.check(label, fn)
        continue
    for label, fn in FAMILIES[family]:
        chk.check(label, fn)
chk.finish()
