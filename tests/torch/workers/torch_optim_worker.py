"""PyTorch DistributedOptimizer and broadcasts on real ranks (run under mpirun).

Usage: torch_optim_worker.py FAMILY [FAMILY ...]

Families:
  train      N ranks on 1/N of a batch reach the parameters of one process on the whole batch
             (computed by every rank itself from the same seed): SGD-momentum and Adam, plain,
             backward_passes_per_step=2, groups=2 (and explicit groups), gradient_predivide_factor,
             fp16 compression.
  overlap    when the allreduces start: during backward, or in step() for a small model
             (torch_optim_overlap.py).
  edge       a parameter unused on every rank / on some ranks, skip_synchronize with gradient
             clipping, zero_grad with pending handles raises, named_parameters validation.
  broadcast  broadcast_parameters (state_dict, named_parameters) and broadcast_optimizer_state
             for SGD-momentum, Adam, AdamW, RMSprop, Adagrad.
  join       uneven numbers of batches per rank: each rank joins when its data ends, the others
             keep stepping (joined ranks contribute zero gradients), and after broadcasting
             from the last rank to join every rank holds the reference parameters.
  sets       DistributedOptimizer, broadcast_parameters and a differentiable allreduce in a
             process set (even / odd ranks train separate models).
"""
import copy
import sys
import warnings

import torch

import collectives as hvd
from collectives.torch.optimizer import (
    Compression,
    DistributedOptimizer,
    broadcast_optimizer_state,
    broadcast_parameters,
)
from common import Checker
from torch_optim_helpers import assert_params_close, assert_same_on_all_ranks, batch, loss_fn, mlp, run_equivalence
from torch_optim_overlap import family_overlap

torch.set_num_threads(1)
R = S = None
chk = None


# ---------------------------------------------------------------- train

def family_train():
    sgd = lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.9)  # noqa: E731
    adam = lambda ps: torch.optim.Adam(ps, lr=0.01)  # noqa: E731
    chk.check("sgd momentum", lambda: run_equivalence(sgd))
    chk.check("adam", lambda: run_equivalence(adam))
    chk.check("sgd backward_passes_per_step=2", lambda: run_equivalence(sgd, passes=2))
    chk.check("adam backward_passes_per_step=2", lambda: run_equivalence(adam, passes=2))
    chk.check("sgd momentum, started in backward", lambda: run_equivalence(sgd, in_backward=True))
    chk.check("adam backward_passes_per_step=2, started in backward",
              lambda: run_equivalence(adam, passes=2, in_backward=True))
    chk.check("sgd groups=2", lambda: run_equivalence(sgd, groups=2))
    chk.check("adam groups=2 passes=2", lambda: run_equivalence(adam, groups=2, passes=2))
    chk.check("sgd gradient_predivide_factor=2", lambda: run_equivalence(sgd, gradient_predivide_factor=2.0))
    chk.check("sgd fp16 compression",
              lambda: run_equivalence(sgd, compression=Compression.fp16, rtol=1e-2, atol=1e-3))
    chk.check("sgd bf16 compression",
              lambda: run_equivalence(sgd, compression=Compression.bf16, rtol=5e-2, atol=1e-2))

    def explicit_groups():
        model = mlp()
        ref = copy.deepcopy(model)
        params = list(model.parameters())
        opt = DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                   named_parameters=model.named_parameters(), groups=[params[0:2], params[4:6]])
        ref_opt = torch.optim.SGD(ref.parameters(), lr=0.1)
        for step in range(3):
            x, y = batch(step, S * 4)
            ref_opt.zero_grad()
            loss_fn(ref, x, y).backward()
            ref_opt.step()
            opt.zero_grad()
            loss_fn(model, x[R * 4:(R + 1) * 4], y[R * 4:(R + 1) * 4]).backward()
            opt.step()
        assert_params_close(model, ref, 1e-5, 1e-6)
        assert len(opt._groups) == 4  # two explicit groups + the two left-over parameters alone
    chk.check("explicit groups", explicit_groups)

    def isinstance_and_state_dict():
        model = mlp()
        opt = DistributedOptimizer(torch.optim.Adam(model.parameters(), lr=0.01))
        assert isinstance(opt, torch.optim.Adam)
        loss_fn(model, *batch(0, 4)).backward()
        opt.step()
        sd = opt.state_dict()
        assert len(sd["state"]) == 6 and sd["param_groups"][0]["lr"] == 0.01
        opt.load_state_dict(sd)
    chk.check("isinstance and state_dict", isinstance_and_state_dict)


# ---------------------------------------------------------------- edge cases

class WithUnused(torch.nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.a = torch.nn.Linear(8, 8)
        self.b = torch.nn.Linear(8, 3)
        self.unused = torch.nn.Linear(8, 3)

    def forward(self, x, use_extra=False):
        h = torch.tanh(self.a(x))
        out = self.b(h)
        return out + self.unused(h) if use_extra else out


def family_edge():
    def unused_everywhere():
        model = WithUnused()
        ref = copy.deepcopy(model)
        opt = DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                   named_parameters=model.named_parameters())
        ref_opt = torch.optim.SGD(ref.parameters(), lr=0.1)
        for step in range(3):
            x, y = batch(step, S * 4)
            ref_opt.zero_grad()
            loss_fn(ref, x, y).backward()
            ref_opt.step()
            opt.zero_grad()
            loss_fn(model, x[R * 4:(R + 1) * 4], y[R * 4:(R + 1) * 4]).backward()
            opt.step()
            assert torch.count_nonzero(model.unused.weight.grad) == 0
        assert_params_close(model, ref, 1e-5, 1e-6)
    chk.check("parameter unused on every rank", unused_everywhere)

    def unused_on_some_ranks():
        model = WithUnused()
        opt = DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                   named_parameters=model.named_parameters())
        for step in range(3):
            x, y = batch(step, 4)
            opt.zero_grad()
            loss_fn(lambda t: model(t, use_extra=(R == 0)), x, y).backward()
            opt.step()
        assert_same_on_all_ranks(model, "unused on some ranks")
    chk.check("parameter unused on some ranks", unused_on_some_ranks)

    def clip_with_skip_synchronize():
        model = mlp()
        ref = copy.deepcopy(model)
        opt = DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                   named_parameters=model.named_parameters())
        ref_opt = torch.optim.SGD(ref.parameters(), lr=0.1)
        for step in range(3):
            x, y = batch(step, S * 4)
            ref_opt.zero_grad()
            loss_fn(ref, x, y).backward()
            torch.nn.utils.clip_grad_norm_(ref.parameters(), 0.05)
            ref_opt.step()
            opt.zero_grad()
            loss_fn(model, x[R * 4:(R + 1) * 4], y[R * 4:(R + 1) * 4]).backward()
            opt.synchronize()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 0.05)
            with warnings.catch_warnings():
                warnings.simplefilter("error")  # no "step() after synchronize()" warning here
                with opt.skip_synchronize():
                    opt.step()
        assert_params_close(model, ref, 1e-5, 1e-6)
    chk.check("skip_synchronize with clipping", clip_with_skip_synchronize)

    def zero_grad_pending():
        model = mlp()
        opt = DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                   named_parameters=model.named_parameters())
        loss_fn(model, *batch(0, 4)).backward()
        try:
            opt.zero_grad()
        except AssertionError as e:
            assert "zero_grad" in str(e)
        else:
            raise AssertionError("zero_grad with pending handles did not raise")
        opt.synchronize()
        opt.zero_grad()  # fine once synchronized
    chk.check("zero_grad with pending handles raises", zero_grad_pending)

    def too_many_backwards():
        model = mlp()
        opt = DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                   named_parameters=model.named_parameters())
        loss_fn(model, *batch(0, 4)).backward()
        try:
            loss_fn(model, *batch(1, 4)).backward()
        except (AssertionError, RuntimeError) as e:
            assert "backward_passes_per_step" in str(e)
        else:
            raise AssertionError("second backward before step() did not raise")
        opt.synchronize()
    chk.check("two backwards with backward_passes_per_step=1 raises", too_many_backwards)

    def argument_validation():
        model = mlp()
        named = list(model.named_parameters())[:-1]
        for kwargs, exc in [({"named_parameters": named}, ValueError),
                            ({"process_set": object()}, ValueError),
                            ({"groups": 0}, ValueError)]:
            try:
                DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), **kwargs)
            except exc:
                pass
            else:
                raise AssertionError(f"{kwargs} did not raise {exc.__name__}")
    chk.check("argument validation", argument_validation)

    def sparse_as_dense():
        torch.manual_seed(0)
        emb = torch.nn.Embedding(10, 4, sparse=True)
        ref = copy.deepcopy(emb)
        opt = DistributedOptimizer(torch.optim.SGD(emb.parameters(), lr=0.1),
                                   named_parameters=emb.named_parameters(), sparse_as_dense=True)
        ref_opt = torch.optim.SGD(ref.parameters(), lr=0.1)
        idx = torch.arange(S * 2) % 10
        ref_opt.zero_grad()
        ref(idx).sum().backward()
        ref.weight.grad = ref.weight.grad.to_dense() / S
        ref_opt.step()
        opt.zero_grad()
        emb(idx[R * 2:(R + 1) * 2]).sum().backward()
        opt.step()
        torch.testing.assert_close(emb.weight.detach(), ref.weight.detach())
    chk.check("sparse_as_dense", sparse_as_dense)

    def bf16_and_fp16_parameters():
        for dtype in (torch.bfloat16, torch.float16):
            model = mlp().to(dtype)
            opt = DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                       named_parameters=model.named_parameters())
            x, y = batch(0, 4)
            opt.zero_grad()
            # The mean squared error spelled out: torch 2.4's mse_loss has no bfloat16 CPU kernel.
            ((model((x + R).to(dtype)) - y.to(dtype)) ** 2).mean().backward()
            opt.synchronize()
            grads = [p.grad.clone() for p in model.parameters()]
            root = hvd.broadcast_object(grads, root_rank=0)
            assert all(g.dtype == dtype and torch.equal(g, r) for g, r in zip(grads, root)), dtype
            with opt.skip_synchronize():
                opt.step()
            assert_same_on_all_ranks(model, f"{dtype} parameters")
    chk.check("bfloat16 / float16 parameters", bf16_and_fp16_parameters)

    def global_process_set():
        import collectives.torch as ct
        model = mlp()
        DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), process_set=ct.global_process_set)
    chk.check("process_set=global_process_set accepted", global_process_set)


# ---------------------------------------------------------------- broadcast

OPTIMIZERS = {
    "SGD-momentum": lambda ps, lr: torch.optim.SGD(ps, lr=lr, momentum=0.9),
    "Adam": lambda ps, lr: torch.optim.Adam(ps, lr=lr),
    "AdamW": lambda ps, lr: torch.optim.AdamW(ps, lr=lr, weight_decay=0.1),
    "RMSprop": lambda ps, lr: torch.optim.RMSprop(ps, lr=lr, momentum=0.5),
    "Adagrad": lambda ps, lr: torch.optim.Adagrad(ps, lr=lr),
}


def family_broadcast():
    def params_state_dict():
        model = mlp(seed=R)
        model.register_buffer("counter", torch.tensor(R, dtype=torch.int64))
        broadcast_parameters(model.state_dict(), root_rank=0)
        expected = mlp(seed=0)
        assert_params_close(model, expected, 0, 0)
        assert int(model.counter) == 0
        assert_same_on_all_ranks(model, "state_dict broadcast")
    chk.check("broadcast_parameters(state_dict)", params_state_dict)

    def params_named():
        model = mlp(seed=R + 10)
        broadcast_parameters(model.named_parameters(), root_rank=S - 1)
        assert_params_close(model, mlp(seed=S - 1 + 10), 0, 0)
        model = mlp(seed=R + 20)
        broadcast_parameters(list(model.named_parameters()), root_rank=0)
        assert_params_close(model, mlp(seed=20), 0, 0)
    chk.check("broadcast_parameters(named_parameters)", params_named)

    def bf16_params():
        torch.manual_seed(R)
        t = torch.randn(5, dtype=torch.bfloat16)
        broadcast_parameters({"t": t}, root_rank=0)
        torch.manual_seed(0)
        assert torch.equal(t, torch.randn(5, dtype=torch.bfloat16))
    chk.check("broadcast_parameters bfloat16", bf16_params)

    for name, make in OPTIMIZERS.items():
        def case(name=name, make=make):
            model = mlp(seed=R)
            opt = make(model.parameters(), 0.01 if R == 0 else 0.5)
            if R == 0:  # only the root has stepped: other ranks have empty (or initial) state
                for step in range(3):
                    opt.zero_grad()
                    loss_fn(model, *batch(step, 4)).backward()
                    opt.step()
            broadcast_parameters(model.state_dict(), root_rank=0)
            broadcast_optimizer_state(opt, root_rank=0)
            root_sd = hvd.broadcast_object(opt.state_dict(), root_rank=0)
            sd = opt.state_dict()
            assert sd["param_groups"] == root_sd["param_groups"], (sd["param_groups"], root_sd["param_groups"])
            assert sd["param_groups"][0]["lr"] == 0.01
            assert sd["state"].keys() == root_sd["state"].keys() and len(sd["state"]) == 6
            for pid, entries in root_sd["state"].items():
                assert entries.keys() == sd["state"][pid].keys()
                for key, value in entries.items():
                    mine = sd["state"][pid][key]
                    if isinstance(value, torch.Tensor):
                        assert torch.equal(mine, value), f"{name} state {pid}.{key} differs"
                    else:
                        assert mine == value
                    if key == "step":
                        assert float(mine) == 3.0, f"{name}: step {mine}"
            # the same gradients on every rank -> identical parameters after a step
            opt.zero_grad()
            loss_fn(model, *batch(99, 4)).backward()
            opt.step()
            assert_same_on_all_ranks(model, f"{name} after a step")
        chk.check(f"broadcast_optimizer_state {name}", case)

    def distributed_optimizer_state():
        model = mlp(seed=R)
        opt = DistributedOptimizer(torch.optim.Adam(model.parameters(), lr=0.01),
                                   named_parameters=model.named_parameters())
        broadcast_parameters(model.state_dict(), root_rank=0)
        broadcast_optimizer_state(opt, root_rank=0)  # nobody has stepped: nothing but param_groups
        for step in range(2):
            opt.zero_grad()
            x, y = batch(step, 4)
            loss_fn(model, x + R, y).backward()
            opt.step()
        broadcast_optimizer_state(opt, root_rank=0)
        assert_same_on_all_ranks(model, "DistributedOptimizer(Adam)")
    chk.check("broadcast_optimizer_state on a DistributedOptimizer", distributed_optimizer_state)


# ---------------------------------------------------------------- join

def family_join():
    def uneven_batches():
        micro, lr = 4, 0.1
        n_batches = [2 + r for r in range(S)]  # rank r has 2 + r batches
        model = mlp(seed=3)
        ref = copy.deepcopy(model)
        opt = DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=lr),
                                   named_parameters=model.named_parameters())
        ref_opt = torch.optim.SGD(ref.parameters(), lr=lr)
        for step in range(max(n_batches)):
            x, y = batch(50 + step, S * micro)
            # reference: ranks still holding data average their gradients over all S ranks
            ref_opt.zero_grad()
            for r in range(S):
                if step < n_batches[r]:
                    rows = slice(r * micro, (r + 1) * micro)
                    (loss_fn(ref, x[rows], y[rows]) / S).backward()
            ref_opt.step()
            if step < n_batches[R]:
                opt.zero_grad()
                loss_fn(model, x[R * micro:(R + 1) * micro], y[R * micro:(R + 1) * micro]).backward()
                opt.step()
        last = hvd.join()
        assert last == S - 1, last
        broadcast_parameters(model.state_dict(), root_rank=last)
        assert_params_close(model, ref, 1e-5, 1e-6, "after join")
    chk.check("uneven batches with join", uneven_batches)


# ---------------------------------------------------------------- process sets

def family_sets():
    import collectives.torch as ct

    even = ct.add_process_set([r for r in range(S) if r % 2 == 0])
    odd = ct.add_process_set([r for r in range(S) if r % 2 == 1])
    mine = even if R % 2 == 0 else odd
    members, me = mine.ranks, mine.rank()

    def optimizer_in_set():
        micro = 4
        model = mlp(seed=10 + R)  # differently initialized: the broadcast makes the set agree
        broadcast_parameters(model.state_dict(), root_rank=members[0], process_set=mine)
        ref = mlp(seed=10 + members[0])
        assert_params_close(model, ref, 0, 0, "broadcast in the set")
        opt = DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9),
                                   named_parameters=model.named_parameters(), process_set=mine)
        ref_opt = torch.optim.SGD(ref.parameters(), lr=0.1, momentum=0.9)
        n = len(members)
        for step in range(3):
            x, y = batch(70 + step, n * micro)
            ref_opt.zero_grad()
            loss_fn(ref, x, y).backward()
            ref_opt.step()
            opt.zero_grad()
            loss_fn(model, x[me * micro:(me + 1) * micro], y[me * micro:(me + 1) * micro]).backward()
            opt.step()
        assert_params_close(model, ref, 1e-5, 1e-6, f"set {members} vs one process")
    chk.check("DistributedOptimizer in a process set", optimizer_in_set)

    def optimizer_per_set():
        # Every rank builds one optimizer per set, as Horovod allows (issue 35 item 2): a member
        # averages over its set; a rank outside the set steps on its own gradients alone.
        micro = 4
        for ps in (even, odd):
            inside, n = R in ps.ranks, len(ps.ranks)
            model, ref = mlp(seed=20), mlp(seed=20)
            opt = DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                       named_parameters=model.named_parameters(), process_set=ps)
            ref_opt = torch.optim.SGD(ref.parameters(), lr=0.1)
            for step in range(2):
                x, y = batch(90 + step, n * micro)
                mine = slice(ps.ranks.index(R) * micro, (ps.ranks.index(R) + 1) * micro) if inside else slice(0, micro)
                ref_opt.zero_grad()
                (loss_fn(ref, x, y) if inside else loss_fn(ref, x[mine], y[mine])).backward()
                ref_opt.step()
                opt.zero_grad()
                loss_fn(model, x[mine], y[mine]).backward()
                opt.step()
            what = f"set {ps.ranks}, rank {R} {'inside' if inside else 'outside'}"
            assert_params_close(model, ref, 1e-5, 1e-6, what)
    chk.check("one DistributedOptimizer per set on every rank", optimizer_per_set)

    def autograd_in_set():
        x = torch.full((3,), float(R + 1), requires_grad=True)
        y = ct.allreduce(x, op=ct.Sum, name="set.ar", process_set=mine)
        torch.testing.assert_close(y.detach(), torch.full((3,), float(sum(r + 1 for r in members))))
        (y * (me + 1)).sum().backward()  # d/dx = allreduce_Sum of the upstream gradients
        torch.testing.assert_close(x.grad, torch.full((3,), float(sum(range(1, len(members) + 1)))))
        g = ct.allgather(torch.full((me + 1, 2), float(R), requires_grad=True), name="set.ag", process_set=mine)
        assert g.shape[0] == sum(range(1, len(members) + 1))
    chk.check("differentiable ops in a process set", autograd_in_set)
    chk.check("remove the sets", lambda: (ct.remove_process_set(odd), ct.remove_process_set(even)))


FAMILIES = {"train": family_train, "overlap": lambda: family_overlap(chk), "edge": family_edge, "broadcast": family_broadcast,
            "join": family_join, "sets": family_sets}


def main():
    global R, S, chk
    hvd.init()
    R, S = hvd.rank(), hvd.size()
    chk = Checker(R)
    for fam in sys.argv[1:]:
        FAMILIES[fam]()
    hvd.shutdown()
    chk.finish()


if __name__ == "__main__":
    main()
