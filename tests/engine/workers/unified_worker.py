"""The framework-agnostic face (``import collectives as hvd``) on real ranks.

Usage: unified_worker.py FAMILY [FAMILY ...]
  torch   the verbs on torch tensors (bfloat16, requires_grad: results are torch tensors and
          gradients flow), async handles, DistributedOptimizer/broadcast_parameters dispatch.
  mixed   one collective, different array types on different ranks (numpy / torch /
          TensorFlow by rank), allreduce, allgather and broadcast, each rank getting its own
          type back; a torch and a TF gradient in flight together.
Every result is checked against numpy references computed from each rank's inputs.
"""
import sys

import numpy as np

import collectives as hvd
from common import Checker, rank_input

hvd.init()
R, S = hvd.rank(), hvd.size()
chk = Checker(R)


def family_torch():
    import torch

    def bf16_and_grad():
        x = torch.tensor(rank_input(1, R, (6,), np.float32), requires_grad=True)
        y = hvd.allreduce(x, op=hvd.Sum, name="u.grad")
        assert isinstance(y, torch.Tensor) and y.requires_grad
        np.testing.assert_allclose(y.detach().numpy(), sum(rank_input(1, r, (6,), np.float32) for r in range(S)))
        (y * 2).sum().backward()
        np.testing.assert_allclose(x.grad.numpy(), np.full(6, 2.0 * S))
        b = torch.arange(4, dtype=torch.bfloat16) + R
        got = hvd.allreduce(b, op=hvd.Sum, name="u.bf16")
        assert got.dtype == torch.bfloat16
        np.testing.assert_allclose(got.float().numpy(), np.arange(4) * S + S * (S - 1) / 2)
    chk.check("torch bfloat16 and requires_grad through collectives.allreduce", bf16_and_grad)

    def other_verbs():
        t = torch.full((R + 1, 2), float(R))
        g = hvd.allgather(t, name="u.ag")
        assert isinstance(g, torch.Tensor) and g.shape == (S * (S + 1) // 2, 2)
        b = hvd.broadcast(torch.tensor([R, R], dtype=torch.int64), S - 1, name="u.bc")
        assert b.tolist() == [S - 1, S - 1]
        h = hvd.allreduce_async(torch.ones(3), op=hvd.Sum, name="u.async")
        assert hvd.synchronize(h).tolist() == [S] * 3
        z = torch.zeros(2)
        assert hvd.allreduce_(z + R, op=hvd.Sum, name="u.inplace").tolist() == [S * (S - 1) / 2] * 2
        out = hvd.grouped_allreduce([torch.ones(2), torch.ones(3, dtype=torch.float64)], op=hvd.Sum, name="u.grp")
        assert [o.tolist() for o in out] == [[S] * 2, [S] * 3]
        assert isinstance(hvd.allreduce(np.ones(2), name="u.np"), np.ndarray)
    chk.check("other verbs on torch tensors", other_verbs)

    def optimizer_dispatch():
        torch.manual_seed(R)
        model = torch.nn.Linear(3, 2)
        hvd.broadcast_parameters(model.state_dict(), root_rank=0)
        opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                       named_parameters=model.named_parameters())
        from collectives.adapters.torch.optimizer import _DistributedOptimizer
        assert isinstance(opt, _DistributedOptimizer) and isinstance(opt, torch.optim.SGD)
        model(torch.full((4, 3), float(R))).sum().backward()
        opt.step()
        hvd.broadcast_optimizer_state(opt, root_rank=0)
        w = hvd.allgather(model.weight.detach().reshape(1, -1), name="u.w")
        assert torch.equal(w[0], w[-1])
        try:
            hvd.DistributedOptimizer(object())
        except TypeError as e:
            assert "torch.optim.Optimizer" in str(e)
        else:
            raise AssertionError("DistributedOptimizer(object()) did not raise")
    chk.check("DistributedOptimizer / broadcast_parameters dispatch for torch", optimizer_dispatch)


def as_my_type(arr):
    """This rank's array in its own type: numpy on rank 0, torch on rank 1, TF on rank 2, ..."""
    kind = R % 3
    if kind == 0:
        return arr, np.ndarray
    if kind == 1:
        import torch
        return torch.from_numpy(arr.copy()), torch.Tensor
    import tensorflow as tf
    return tf.constant(arr), tf.Tensor


def to_numpy(x):
    return x.numpy() if hasattr(x, "numpy") and not isinstance(x, np.ndarray) else np.asarray(x)


def family_mixed():
    def one_collective_three_types():
        for step in range(3):  # repeated: the cached path too
            for dtype in (np.float32, np.int32):
                x, kind = as_my_type(rank_input(step, R, (5, 2), dtype))
                y = hvd.allreduce(x, op=hvd.Sum, name=f"mixed.ar.{np.dtype(dtype).name}")
                assert isinstance(y, kind), type(y)
                np.testing.assert_allclose(to_numpy(y), sum(rank_input(step, r, (5, 2), dtype) for r in range(S)))
            x, kind = as_my_type(rank_input(9, R, (R + 1, 3), np.float64))
            g = hvd.allgather(x, name="mixed.ag")
            assert isinstance(g, kind)
            np.testing.assert_array_equal(to_numpy(g), np.concatenate([rank_input(9, r, (r + 1, 3), np.float64)
                                                                        for r in range(S)]))
            x, kind = as_my_type(rank_input(11, R, (4,), np.int64))
            b = hvd.broadcast(x, S - 1, name="mixed.bc")
            assert isinstance(b, kind)
            np.testing.assert_array_equal(to_numpy(b), rank_input(11, S - 1, (4,), np.int64))
    chk.check("allreduce / allgather / broadcast with numpy, torch and TF on different ranks",
              one_collective_three_types)

    def torch_and_tf_in_flight_together():
        import tensorflow as tf
        import torch
        a = hvd.allreduce_async(torch.full((3,), float(R)), op=hvd.Sum, name="both.torch")
        b = hvd.allreduce_async(tf.fill([2], float(R)), op=hvd.Sum, name="both.tf")
        total = S * (S - 1) / 2
        ra, rb = hvd.synchronize(a), hvd.synchronize(b)
        assert isinstance(ra, torch.Tensor) and ra.tolist() == [total] * 3
        assert isinstance(rb, tf.Tensor) and rb.numpy().tolist() == [total] * 2
    chk.check("a torch and a TF tensor in flight together", torch_and_tf_in_flight_together)


FAMILIES = {"torch": family_torch, "mixed": family_mixed}
for fam in sys.argv[1:]:
    FAMILIES[fam]()
chk.finish()
