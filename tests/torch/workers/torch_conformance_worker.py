"""Horovod behaviours of collectives.torch that Horovod scripts rely on (run under mpirun).

Usage: torch_conformance_worker.py FAMILY [FAMILY ...]

Families:
  builds        ccl_built() / ddl_built() answer False in ``collectives`` and ``collectives.torch``.
  rsgrad        gradients of reducescatter / grouped_reducescatter: Horovod's convention (the
                allgathered upstream gradient, times the set's size for Sum, times the scale factors).
  optstate      broadcast_optimizer_state on fresh optimizers (a parameter without gradient, SGD with
                weight decay, SparseAdam, ``model=`` with a sparse embedding) and
                DistributedOptimizer(num_groups=...).
  sparse        sparse_allreduce_async against numpy sums (Sum, Average, integer values, empty
                tensors), its errors on every rank, and DistributedOptimizer training a model with
                sparse embeddings (sparse_as_dense=False) to the parameters of one process.
  commsets      process sets built from mpi4py communicators that differ per rank (comm.Split):
                at init and with add_process_set, collectives inside them, and the errors when
                ranks disagree.

The job starts as Horovod's documentation shows: ``hvd.init(comm=MPI.COMM_WORLD,
process_sets=[hvd.ProcessSet(comm.Split(rank % 2))])``.
"""
import copy
import sys
import warnings

import numpy as np
import torch
from mpi4py import MPI

import collectives
import collectives.torch as hvd
from common import Checker, raises, rank_input

torch.set_num_threads(1)
WORLD = MPI.COMM_WORLD
PARITY_COMM = WORLD.Split(WORLD.Get_rank() % 2, WORLD.Get_rank())
PARITY_SET = hvd.ProcessSet(PARITY_COMM)
hvd.init(comm=WORLD, process_sets=[PARITY_SET])
R, S = hvd.rank(), hvd.size()
chk = Checker(R)



# ---------------------------------------------------------------- builds

def family_builds():
    def answers():
        for face in (collectives, hvd):
            assert face.ccl_built() is False and face.ddl_built() is False, face.__name__
    chk.check("ccl_built/ddl_built are False", answers)


# ---------------------------------------------------------------- reducescatter gradients

def _rows(dim0, rank, n):
    """(offset, rows) of rank's block of a reducescatter over n ranks."""
    sizes = [dim0 // n + (1 if r < dim0 % n else 0) for r in range(n)]
    return sum(sizes[:rank]), sizes[rank]


def family_rsgrad():
    dim0 = 2 * S + 1  # uneven blocks: the first rank gets one more row
    cases = [("Sum", hvd.Sum, 1.0, 1.0), ("Average", hvd.Average, 1.0, 1.0), ("Sum scaled", hvd.Sum, 0.5, 3.0),
             ("Average scaled", hvd.Average, 2.0, 0.25)]
    for label, op, pre, post in cases:
        def case(label=label, op=op, pre=pre, post=post):
            x = torch.tensor(rank_input(1, R, (dim0, 3), np.float64), requires_grad=True)
            y = hvd.reducescatter(x, op=op, name=f"rs.{label}", prescale_factor=pre, postscale_factor=post)
            # dL/dy on rank r is w_r; Horovod's dx = allgather(w) * (S for Sum) * pre * post on every rank
            weights = [rank_input(2, r, (_rows(dim0, r, S)[1], 3), np.float64) for r in range(S)]
            (y * torch.tensor(weights[R])).sum().backward()
            expected = np.concatenate(weights) * (S if op == hvd.Sum else 1) * pre * post
            np.testing.assert_allclose(x.grad.numpy(), expected, rtol=1e-12)
        chk.check(f"reducescatter gradient {label}", case)

    def grouped():
        xs = [torch.tensor(rank_input(3 + i, R, (dim0, 2), np.float64), requires_grad=True) for i in range(2)]
        ys = hvd.grouped_reducescatter(xs, op=hvd.Sum, name="grs")
        weights = [[rank_input(10 + i, r, (_rows(dim0, r, S)[1], 2), np.float64) for r in range(S)]
                   for i in range(2)]
        sum((y * torch.tensor(w[R])).sum() for y, w in zip(ys, weights)).backward()
        for x, w in zip(xs, weights):
            np.testing.assert_allclose(x.grad.numpy(), np.concatenate(w) * S, rtol=1e-12)
    chk.check("grouped_reducescatter gradient Sum", grouped)


# ---------------------------------------------------------------- optimizer state

class ModelNoGrad(torch.nn.Module):
    """Horovod's test model: one parameter that takes no gradient."""

    def __init__(self):
        super().__init__()
        self.a = torch.nn.Parameter(torch.tensor([1, 3], dtype=torch.int32), requires_grad=False)
        self.b = torch.nn.Parameter(torch.rand(4))

    def forward(self, x):
        return torch.index_select(self.b, 0, self.a.long()) * x


def all_equal(t, what):
    gathered = hvd.allgather(t.detach().reshape(1, -1).to(torch.float64), name=f"eq.{what}")
    assert torch.equal(gathered, gathered[:1].expand_as(gathered)), f"{what} differs between ranks"


def family_optstate():
    def no_grad_parameter():
        torch.manual_seed(0)
        model = ModelNoGrad()
        before = model.b.detach().clone()
        opt = torch.optim.SGD(model.parameters(), lr=0.1, weight_decay=0.5, momentum=0.9, nesterov=True)
        opt = hvd.DistributedOptimizer(opt, named_parameters=model.named_parameters())
        hvd.broadcast_optimizer_state(opt, root_rank=0)
        grad = opt.param_groups[0]["params"][1].grad
        assert opt.param_groups[0]["params"][0].grad is None
        assert grad is not None and torch.equal(grad, hvd.broadcast(grad, root_rank=0, name="nograd.g"))
        assert torch.equal(model.b.detach(), before), "the state initialization moved the parameters"
        assert len(opt.state_dict()["state"]) == 1  # momentum buffer of b only
        all_equal(opt.state_dict()["state"][1]["momentum_buffer"], "nograd.momentum")
        # training afterwards: every rank steps alike
        model(torch.ones(2)).sum().backward()
        opt.step()
        all_equal(model.b, "nograd.after")
    chk.check("broadcast_optimizer_state: a parameter without gradient, fresh optimizer", no_grad_parameter)

    def root_state_others_fresh():
        torch.manual_seed(R)
        model = torch.nn.Linear(3, 2)
        hvd.broadcast_parameters(model.state_dict(), root_rank=0)
        opt = torch.optim.AdamW(model.parameters(), lr=0.1, weight_decay=0.3)
        if R == 0:
            model(torch.ones(4, 3)).sum().backward()
            opt.step()
        before = [p.detach().clone() for p in model.parameters()]
        hvd.broadcast_optimizer_state(opt, root_rank=0)
        for p, b in zip(model.parameters(), before):
            assert torch.equal(p.detach(), b), "broadcast_optimizer_state moved the parameters"
        for pid, entries in opt.state_dict()["state"].items():
            assert float(entries["step"]) == 1.0
            all_equal(entries["exp_avg"], f"adamw.{pid}")
    chk.check("broadcast_optimizer_state: root stepped, AdamW with weight decay elsewhere fresh",
              root_state_others_fresh)

    def sparse_embedding_model():
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Embedding(6, 3, sparse=True), torch.nn.Linear(3, 1))
        opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.5)
        hvd.broadcast_optimizer_state(opt, root_rank=0, model=model)
        assert model[0].weight.grad.is_sparse and not model[1].weight.grad.is_sparse
        assert len(opt.state_dict()["state"]) == 3
        sparse_adam = torch.optim.SparseAdam(model[0].parameters(), lr=0.1)
        hvd.broadcast_optimizer_state(sparse_adam, root_rank=0)  # SparseAdam takes only sparse gradients
        entries = sparse_adam.state_dict()["state"][0]
        assert float(entries["step"]) == 1.0 and entries["exp_avg"].shape == (6, 3)
        raises(ValueError, lambda: hvd.broadcast_optimizer_state(opt, 0, model=object()), "torch.nn.Module")
    chk.check("broadcast_optimizer_state(model=): sparse embeddings get sparse zero gradients",
              sparse_embedding_model)

    def num_groups():
        torch.manual_seed(1)
        model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 1))
        ref = copy.deepcopy(model)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                           named_parameters=model.named_parameters(), num_groups=2)
        assert any(issubclass(w.category, DeprecationWarning) and "num_groups" in str(w.message) for w in caught)
        assert opt._groups is not None and len(opt._groups) == 2
        ref_opt = torch.optim.SGD(ref.parameters(), lr=0.1)
        xs = [torch.tensor(rank_input(20, r, (3, 4), np.float32)) for r in range(S)]
        ref_opt.zero_grad()
        for x in xs:
            (ref(x).sum() / S).backward()
        ref_opt.step()
        model(xs[R]).sum().backward()
        opt.step()
        for p, q in zip(model.parameters(), ref.parameters()):
            torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-6)
    chk.check("DistributedOptimizer(num_groups=2) groups and trains like one process", num_groups)


# ---------------------------------------------------------------- sparse

def sparse_input(seed, rank, shape, nnz, dtype=torch.float64):
    """Rank's COO tensor: nnz entries at random rows (duplicates included)."""
    rng = np.random.default_rng([seed, rank])
    rows = torch.tensor(rng.integers(0, shape[0], size=(1, nnz)), dtype=torch.int64)
    values = torch.tensor(rng.integers(-8, 8, size=(nnz, *shape[1:]))).to(dtype)
    return torch.sparse_coo_tensor(rows, values, shape)


def family_sparse():
    shape = (7, 3)
    for label, op in (("Sum", hvd.Sum), ("Average", hvd.Average)):
        def case(label=label, op=op):
            inputs = [sparse_input(5, r, shape, nnz=2 + r) for r in range(S)]
            handle = hvd.sparse_allreduce_async(inputs[R], name=f"sp.{label}", op=op)
            result = hvd.synchronize(handle)
            assert result.is_sparse and result.is_coalesced() and result.dtype == torch.float64
            expected = sum(t.to_dense().numpy() for t in inputs) / (S if op == hvd.Average else 1)
            np.testing.assert_allclose(result.to_dense().numpy(), expected, rtol=1e-12)
            assert handle() is result  # Horovod's handles are callables
        chk.check(f"sparse_allreduce_async {label}", case)

    def integer_and_empty():
        inputs = [sparse_input(6, r, shape, nnz=3, dtype=torch.int32) for r in range(S)]
        result = hvd.sparse_allreduce_async(inputs[R], name="sp.int", op=hvd.Average)()
        expected = np.trunc(sum(t.to_dense().numpy().astype(np.float64) for t in inputs) / S)
        assert result.dtype == torch.int32
        np.testing.assert_array_equal(result.to_dense().numpy(), expected)
        empty = torch.sparse_coo_tensor(torch.empty((1, 0), dtype=torch.int64), torch.empty((0, 3)), shape)
        mine = empty if R == 0 else sparse_input(7, R, shape, nnz=2, dtype=torch.float32)
        got = hvd.synchronize(hvd.sparse_allreduce_async(mine, name="sp.empty", op=hvd.Sum))
        expected = sum(sparse_input(7, r, shape, nnz=2, dtype=torch.float32).to_dense() for r in range(1, S))
        torch.testing.assert_close(got.to_dense(), expected)
    chk.check("sparse_allreduce_async: integer Average truncates, an empty rank", integer_and_empty)

    def errors():
        raises(collectives.InvalidArgumentError, lambda: hvd.sparse_allreduce_async(torch.ones(3), "sp.dense",
                                                                                      hvd.Sum), "sparse COO")
        raises(NotImplementedError, lambda: hvd.sparse_allreduce_async(sparse_input(8, R, shape, 2), "sp.max",
                                                                         hvd.Max), "Sum and Average")
    chk.check("sparse_allreduce_async errors (every rank)", errors)

    def embedding_training():
        torch.manual_seed(2)
        model = torch.nn.ModuleDict({"a": torch.nn.Embedding(10, 3, sparse=True),
                                     "b": torch.nn.Embedding(10, 3, sparse=True), "out": torch.nn.Linear(3, 1)})
        ref = copy.deepcopy(model)
        opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.5),
                                       named_parameters=model.named_parameters())
        ref_opt = torch.optim.SGD(ref.parameters(), lr=0.5)

        def loss(m, step, rank):
            ids = torch.tensor(rank_input(30 + step, rank, (4,), np.int64, 0, 10))
            value = m["out"](m["a"](ids)).mean()
            if step == 0 or rank == 0:  # after the first step only rank 0 uses "b"
                value = value + m["out"](m["b"](ids)).mean()
            return value

        for step in range(3):
            ref_opt.zero_grad()
            for r in range(S):
                (loss(ref, step, r) / S).backward()
            ref_opt.step()
            opt.zero_grad()
            loss(model, step, R).backward()
            opt.step()
            assert model["a"].weight.grad.is_sparse and model["b"].weight.grad.is_sparse
        for (name, p), q in zip(model.named_parameters(), ref.parameters()):
            torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-6, msg=lambda m: f"{name}: {m}")
    chk.check("DistributedOptimizer with sparse embeddings (sparse_as_dense=False)", embedding_training)

    def sparse_in_groups():
        torch.manual_seed(3)
        model = torch.nn.Sequential(torch.nn.Embedding(5, 2, sparse=True), torch.nn.Linear(2, 1))
        ref = copy.deepcopy(model)
        opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.5),
                                       named_parameters=model.named_parameters(), groups=1, op=hvd.Sum)
        ref_opt = torch.optim.SGD(ref.parameters(), lr=0.5)
        ids = [torch.tensor(rank_input(40, r, (3,), np.int64, 0, 5)) for r in range(S)]
        for r in range(S):
            ref(ids[r]).sum().backward()
        ref_opt.step()
        model(ids[R]).sum().backward()
        opt.step()
        for p, q in zip(model.parameters(), ref.parameters()):
            torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-6)
    chk.check("DistributedOptimizer groups=1 op=Sum with a sparse member", sparse_in_groups)


# ---------------------------------------------------------------- process sets from communicators

def family_commsets():
    def at_init():
        mine = [r for r in range(S) if r % 2 == R % 2]
        assert PARITY_SET.ranks == mine and PARITY_SET.included() and PARITY_SET.size() == len(mine)
        assert PARITY_SET.rank() == mine.index(R)
        ids = hvd.allgather_object(PARITY_SET.process_set_id, name="commsets.ids")
        assert len({ids[r] for r in range(S) if r % 2 == 0}) == 1 and ids[0] != 0
        if S > 1:
            assert ids[0] != ids[1], ids
        x = torch.tensor(rank_input(50, R, (4,), np.float64))
        got = hvd.allreduce(x, op=hvd.Sum, name="commsets.sum", process_set=PARITY_SET)
        expected = sum(rank_input(50, r, (4,), np.float64) for r in mine)
        np.testing.assert_allclose(got.numpy(), expected)
    chk.check("init(process_sets=[ProcessSet(comm.Split(rank % 2))])", at_init)

    def added_later():
        # ranks {0, 1} and the rest (at np=2: the whole job, which is the global set)
        comm = WORLD.Split(0 if R < 2 else 1, R)
        ps = hvd.add_process_set(hvd.ProcessSet(comm))
        mine = [r for r in range(S) if (r < 2) == (R < 2)]
        assert ps.ranks == mine and ps.included()
        if S == 2:
            assert ps.process_set_id == 0
        got = hvd.allgather(torch.tensor([[float(R)]]), name="commsets.later", process_set=ps)
        assert got.reshape(-1).tolist() == [float(r) for r in mine]
    chk.check("add_process_set(ProcessSet(comm.Split(...)))", added_later)

    def disagreeing():
        whole = WORLD.Split(0, R)
        comm = MPI.COMM_SELF if R == S - 1 else whole  # the last rank claims a group of its own
        raises(collectives.InvalidArgumentError, lambda: hvd.add_process_set(hvd.ProcessSet(comm)),
               "communicators disagree")
        mixed = hvd.ProcessSet([0, 1]) if R == 0 else hvd.ProcessSet(whole)
        raises(collectives.InvalidArgumentError, lambda: hvd.add_process_set(mixed), "same kind of set")
        # the engine is still usable afterwards
        got = hvd.allreduce(torch.ones(2), op=hvd.Sum, name="commsets.after")
        assert got.tolist() == [float(S)] * 2
    chk.check("communicators that disagree / mixed kinds: InvalidArgumentError on every rank", disagreeing)


FAMILIES = {"builds": family_builds, "rsgrad": family_rsgrad, "optstate": family_optstate, "sparse": family_sparse,
            "commsets": family_commsets}


def main():
    for fam in sys.argv[1:]:
        FAMILIES[fam]()
    hvd.shutdown()
    chk.finish()


if __name__ == "__main__":
    main()
