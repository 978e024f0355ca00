"""DistributedOptimizer(zero_stage=1/2) on real ranks (run under mpirun), against the unsharded
DistributedOptimizer stepping a copy of the same model on the same data in the same process.

Usage: torch_zero_worker.py FAMILY [FAMILY ...] (``save:DIR`` / ``load:DIR`` take a directory)

Families:
  equiv    SGD-momentum, Adam, AdamW (two param groups with their own lr and weight decay; fp32 and
           bf16 parameters; a frozen parameter; one that never gets a gradient), stages 1 and 2, with
           backward_passes_per_step=2, fp16 compression, op=Sum, gradient_predivide_factor: the
           parameters after K steps equal the unsharded optimizer's (bitwise or a stated tolerance),
           the state per rank is 1/N of the elements, p.grad is what docs/zero.md says.
  more     Adagrad, RMSprop, Adamax, NAdam, RAdam (stage 2); broadcast_optimizer_state.
  clip     clip_grad_norm_ over the shards against torch's on the reduced whole gradients.
  ckpt     consolidate_state_dict -> a plain torch optimizer; a plain state dict -> sharded.
  save:D   sharded checkpoint written to D (with the consolidated one and the model, to compare).
  load:D   that checkpoint loaded at this number of ranks: same state, same next step.
  errors   refusals and a parameter list that differs on one rank: typed errors on every rank.
  sets     sharded over a process set of ranks 0 and 1 (others step alone).
  reuse    the flat gradient buffers are reused, not allocated per step (stage 1: p.grad views of
           them; stage 2: a pool of two), also with zero_grad(set_to_none=False).
"""
import copy
import os
import sys

import torch

import collectives as hvd
from collectives.adapters.torch import zero_buckets
from collectives.errors import InvalidArgumentError, NotSupportedError, TensorMismatchError
from collectives.torch.optimizer import Compression, DistributedOptimizer, broadcast_optimizer_state
from common import Checker, raises

torch.set_num_threads(1)
zero_buckets.BUCKET_BYTES = 300  # several buckets, parameters across shard boundaries
R = S = None
chk = None
STEPS = 3


class Net(torch.nn.Module):
    """fp32 and bf16 layers, a frozen parameter and one that never gets a gradient."""

    def __init__(self, bf16=True):
        super().__init__()
        torch.manual_seed(0)
        self.a = torch.nn.Linear(8, 16)
        self.b = torch.nn.Linear(16, 16).to(torch.bfloat16 if bf16 else torch.float32)
        self.c = torch.nn.Linear(16, 3)
        self.frozen = torch.nn.Parameter(torch.randn(5), requires_grad=False)
        self.unused = torch.nn.Parameter(torch.randn(7))

    def forward(self, x):
        h = torch.tanh(self.a(x))
        h = torch.tanh(self.b(h.to(self.b.weight.dtype)).float())
        return self.c(h) + self.frozen.sum()


def groups(model, extra=()):
    return [{"params": [model.a.weight, model.a.bias, model.frozen, model.unused, *extra], "lr": 0.05,
             "weight_decay": 0.01},
            {"params": [model.b.weight, model.b.bias, model.c.weight, model.c.bias], "lr": 0.02,
             "weight_decay": 0.0}]


OPTIMIZERS = {
    "sgd": lambda g: torch.optim.SGD(g, lr=0.1, momentum=0.9),
    "adam": lambda g: torch.optim.Adam(g, lr=0.01),
    "adamw": lambda g: torch.optim.AdamW(g, lr=0.01),
}


def batch(step, rank, rows=4):
    g = torch.Generator().manual_seed(100 * step + rank)
    return torch.randn(rows, 8, generator=g), torch.randn(rows, 3, generator=g)


def train(model, opt, steps, passes=1, first=0):
    for step in range(first, first + steps):
        opt.zero_grad()
        for micro in range(passes):
            x, y = batch(step * passes + micro, R)
            torch.nn.functional.mse_loss(model(x), y).backward()
        opt.step()


def pair(kind, stage, **kw):
    """(model, sharded optimizer, reference model, unsharded optimizer)."""
    model, ref = Net(), Net()
    zopt = DistributedOptimizer(OPTIMIZERS[kind](groups(model)), named_parameters=model.named_parameters(),
                                zero_stage=stage, **kw)
    ropt = DistributedOptimizer(OPTIMIZERS[kind](groups(ref)), named_parameters=ref.named_parameters(), **kw)
    return model, zopt, ref, ropt


def assert_same_params(model, ref, tolerance, what, alone=False):
    """``alone``: this rank does not communicate (one rank, or outside the process set): the plain
    optimizer then skips the parameter without a gradient, the sharded one steps it with zeros
    (its weight decay shows), as both do on several ranks (docs/zero.md)."""
    for (name, p), q in zip(model.named_parameters(), ref.parameters()):
        if alone and name == "unused":
            continue
        if tolerance is None:
            assert torch.equal(p, q), f"{what} {name}: max diff {(p.float() - q.float()).abs().max()}"
        else:
            torch.testing.assert_close(p, q, rtol=tolerance, atol=tolerance, msg=lambda m: f"{what} {name}: {m}")


def state_numel(opt):
    return sum(v.numel() for st in opt.state.values() for v in st.values() if isinstance(v, torch.Tensor) and v.dim())


# ---------------------------------------------------------------- equiv

# Bitwise where the arithmetic is the same: two summands add the same in either order, and Adam's
# and AdamW's kernels give the same bits on a flat shard as on each tensor. Not so: three summands
# added in another order (reducescatter against allreduce), fp16 on the wire, and SGD's bf16
# ``param.add_(buf, alpha=-lr)``, whose bits depend on the tensor's length (torch's vectorized
# loop against its scalar one for short tensors: measured, 16 of 200 random 16-element cases
# differ from the same elements in a 32-element tensor); a bf16 ulp then moves the fp32 layers.
def tolerance(kw, kind="adam"):
    if "compression" in kw:
        return 1e-2
    if kind == "sgd":
        return 2e-3
    return None if S <= 2 else 1e-5


def family_equiv():
    for kind in OPTIMIZERS:
        for stage in (1, 2):
            for label, kw in [("plain", {}), ("passes2", {"backward_passes_per_step": 2}),
                              ("fp16", {"compression": Compression.fp16}), ("sum", {"op": hvd.Sum}),
                              ("predivide", {"gradient_predivide_factor": 2.0})]:
                if kind != "adam" and label not in ("plain", "passes2"):
                    continue
                chk.check(f"equiv {kind} stage {stage} {label}", lambda: equiv(kind, stage, kw))


def equiv(kind, stage, kw):
    model, zopt, ref, ropt = pair(kind, stage, **kw)
    passes = kw.get("backward_passes_per_step", 1)
    train(model, zopt, STEPS, passes)
    train(ref, ropt, STEPS, passes)
    assert_same_params(model, ref, tolerance(kw, kind), f"{kind} stage {stage}")
    # p.grad between steps: the local accumulated gradient at stage 1, None at stage 2
    x, y = batch(99, R)
    torch.nn.functional.mse_loss(model(x), y).backward()
    if S > 1 and passes == 1:  # the reducescatters of the full buckets started during backward
        waiting = [b for b in zopt._buckets if any(s.param is model.unused for s in b.slots)]
        assert len(zopt._pending) == len(zopt._buckets) - len(waiting), (len(zopt._pending), len(zopt._buckets))
    zopt.synchronize()
    if stage == 2:
        assert all(p.grad is None for p in zopt._requires_update), "stage 2 keeps full gradients"
    else:
        assert model.a.weight.grad is not None and model.unused.grad is None
    assert model.frozen.grad is None
    with zopt.skip_synchronize():
        zopt.step()
    # state per rank: 1/N of the (padded) buckets, for every elementwise state tensor
    full = state_numel(ropt)
    padded = sum(b.length for b in zopt._buckets)
    per_tensor = {"sgd": 1, "adam": 2, "adamw": 2}[kind]
    assert zopt.shard_state_numel() == per_tensor * padded // S, (zopt.shard_state_numel(), padded, S)
    assert full == per_tensor * sum(p.numel() for p in zopt._requires_update)
    assert zopt.shard_state_numel() <= full / S + per_tensor * len(zopt._buckets) * 16, "padding beyond alignment"
    assert len(zopt.state) == 0


def family_more():
    """The other elementwise optimizers, stage 2 (Adagrad: state made at construction, carried over),
    on fp32 parameters (RMSprop's momentum meets SGD's bf16 rounding, see tolerance())."""
    more = {"adagrad": lambda g: torch.optim.Adagrad(g, lr=0.05, initial_accumulator_value=0.1),
            "rmsprop": lambda g: torch.optim.RMSprop(g, lr=0.01, momentum=0.5),
            "adamax": lambda g: torch.optim.Adamax(g, lr=0.01), "nadam": lambda g: torch.optim.NAdam(g, lr=0.01),
            "radam": lambda g: torch.optim.RAdam(g, lr=0.01)}

    def case(make):
        model, ref = Net(bf16=False), Net(bf16=False)
        zopt = DistributedOptimizer(make(groups(model)), zero_stage=2)
        ropt = DistributedOptimizer(make(groups(ref)))
        train(model, zopt, STEPS)
        train(ref, ropt, STEPS)
        assert_same_params(model, ref, 1e-5, "elementwise optimizer", alone=S == 1)

    for name, make in more.items():
        chk.check(f"more: {name}", lambda: case(make))

    def broadcast():
        model, zopt, ref, ropt = pair("adam", 1)
        train(ref, ropt, STEPS)
        if R == 0:  # a loaded checkpoint's hyperparameters, on the root only
            zopt.load_state_dict(ropt.state_dict())
            zopt.param_groups[1]["lr"] = 0.125
        broadcast_optimizer_state(zopt, root_rank=0)  # hyperparameters only (docs/zero.md)
        assert zopt.param_groups[1]["lr"] == 0.125
        zopt.consolidate_state_dict(to=S - 1)  # rank 0 has state, the others none: no hang
        if R == S - 1 and S > 1:  # rank 0's slices of the reference state, zeros elsewhere
            got, want = zopt.state_dict()["state"], ropt.state_dict()["state"]
            loaded = 0
            for i, entry in got.items():
                for key in ("exp_avg", "exp_avg_sq"):
                    v, w = entry[key], want[i][key]
                    assert torch.all((v == w) | (v == 0)), f"state {i} {key}"
                    loaded += int(torch.count_nonzero(v))
            assert 0 < loaded < sum(int(torch.count_nonzero(st["exp_avg"])) for st in want.values()) * 2
    chk.check("broadcast_optimizer_state", broadcast)


# ---------------------------------------------------------------- clip

def family_clip():
    for stage in (1, 2):
        chk.check(f"clip stage {stage}", lambda: clip(stage))


def clip(stage):
    model, zopt, ref, ropt = pair("sgd", stage)
    twin = dict(zip(model.parameters(), ref.parameters()))
    for step in range(STEPS):
        for m, opt in ((model, zopt), (ref, ropt)):
            opt.zero_grad()
            x, y = batch(step, R)
            (10 * torch.nn.functional.mse_loss(m(x), y)).backward()
        total = zopt.clip_grad_norm_(0.5)
        ropt.synchronize()
        # torch.nn.utils.clip_grad_norm_'s algorithm with the norms in float64 (torch's own takes a
        # bf16 gradient's norm in bf16: 3 digits)
        grads = [p.grad for p in ref.parameters() if p.grad is not None]
        expected = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g, dtype=torch.float64)
                                                         for g in grads]))
        for g in grads:
            g.mul_(torch.clamp(0.5 / (expected + 1e-6), max=1.0).to(g.dtype))
        torch.testing.assert_close(total.double(), expected, rtol=1e-5, atol=1e-6)
        assert expected > 0.5, "the case must clip"
        # each shard's clipped gradient against the same elements of torch's clipped gradients
        for bucket, shard in zip(zopt._buckets, zopt._shards):
            for slot, src, dst, n in bucket.pieces():
                want = twin[slot.param].grad
                torch.testing.assert_close(shard.grad[dst:dst + n], want.reshape(-1)[src:src + n].to(shard.dtype),
                                           rtol=1e-5 if shard.dtype == torch.float32 else 1e-2, atol=1e-6)
        for opt in (zopt, ropt):
            with opt.skip_synchronize():
                opt.step()
    assert_same_params(model, ref, tolerance({}, "sgd"), f"clip stage {stage}")


# ---------------------------------------------------------------- reuse

def family_reuse():
    """No per-step allocation of flat gradient buckets (zero_grad_buffers.py), results unchanged."""
    for stage in (1, 2):
        chk.check(f"reuse stage {stage}, zero_grad(set_to_none=False)", lambda: in_place_grads(stage))
    chk.check("reuse stage 1: p.grad views of buffers kept over steps", stage1_views)
    chk.check("reuse stage 2: a pool of at most two buffers, kept over steps", stage2_pool)


def in_place_grads(stage):
    """Gradients zeroed in place: at stage 1 the backward accumulates into the buffers' views."""
    model, zopt, ref, ropt = pair("adam", stage)
    for step in range(STEPS):
        for m, opt in ((model, zopt), (ref, ropt)):
            opt.zero_grad(set_to_none=False)
            x, y = batch(step, R)
            torch.nn.functional.mse_loss(m(x), y).backward()
            opt.step()
    assert_same_params(model, ref, tolerance({}), f"in-place gradients stage {stage}")


def storages(params):
    return [p.grad.untyped_storage().data_ptr() for p in params]


def stage1_views():
    model, zopt, ref, ropt = pair("adam", 1)
    seen = None
    for step in range(STEPS):
        train(model, zopt, 1, first=step)
        train(ref, ropt, 1, first=step)
        if S == 1:
            continue
        for bucket in zopt._buckets:  # each parameter's gradient lies in its bucket's buffer
            got = [p.grad for p in (s.param for s in bucket.slots) if p.grad is not None]
            assert len({g.untyped_storage().data_ptr() for g in got}) == 1, "p.grad not views of one buffer"
        now = storages(p for p in zopt._requires_update if p.grad is not None)
        assert seen is None or now == seen, "gradient buffers allocated anew"
        seen = now
    assert_same_params(model, ref, tolerance({}), "stage 1 views")


def stage2_pool():
    model, zopt, ref, ropt = pair("adam", 2)
    assert len(zopt._buckets) > 2, "the case needs more buckets than the pool has buffers"
    seen = None
    for step in range(STEPS):
        train(model, zopt, 1, first=step)
        train(ref, ropt, 1, first=step)
        if S == 1:
            continue
        pool = zopt._grad_buffers
        free = [buf for bufs in pool._free.values() for buf in bufs]
        assert not pool._in_use and len(free) == 2, (len(pool._in_use), len(free))
        now = sorted(buf.data_ptr() for buf in free)
        assert seen is None or now == seen, "pool buffers allocated anew"
        seen = now
    assert_same_params(model, ref, tolerance({}), "stage 2 pool")


# ---------------------------------------------------------------- checkpoints

def family_ckpt():
    for stage in (1, 2):
        chk.check(f"consolidated -> plain, stage {stage}", lambda: consolidated_to_plain(stage))
        chk.check(f"plain -> sharded, stage {stage}", lambda: plain_to_sharded(stage))
    chk.check("state_dict without consolidation raises", no_consolidation)


UNUSED = 3  # the position of Net.unused in groups()


def assert_same_state(a, b, what, alone=False):
    """``alone``: see assert_same_params (the plain optimizer has no state for Net.unused)."""
    if alone:
        a, b = ({"param_groups": d["param_groups"], "state": {k: v for k, v in d["state"].items() if k != UNUSED}}
                for d in (a, b))
    assert a["param_groups"] == b["param_groups"], f"{what}: param_groups differ"
    assert a["state"].keys() == b["state"].keys(), f"{what}: {sorted(a['state'])} vs {sorted(b['state'])}"
    for i in a["state"]:
        assert a["state"][i].keys() == b["state"][i].keys(), what
        for key, value in a["state"][i].items():
            other = b["state"][i][key]
            assert torch.equal(value, other) if S <= 2 else torch.allclose(value.float(), other.float(), 1e-5, 1e-6), \
                f"{what}: state {i} {key} differs"


def consolidated_to_plain(stage):
    model, zopt, ref, ropt = pair("adam", stage)
    train(model, zopt, STEPS)
    train(ref, ropt, STEPS)
    zopt.consolidate_state_dict(to=S - 1)
    if R == S - 1:
        full = zopt.state_dict()
        assert_same_state(full, ropt.state_dict(), "consolidated", alone=S == 1)
        plain = torch.optim.Adam(groups(copy.deepcopy(model)), lr=0.01)
        plain.load_state_dict(full)
        assert_same_state(plain.state_dict(), full, "loaded into a plain Adam")
    else:
        raises(RuntimeError, zopt.state_dict, "consolidate_state_dict(to=R)")


def plain_to_sharded(stage):
    model, zopt, ref, ropt = pair("adamw", stage)
    train(ref, ropt, STEPS)
    model.load_state_dict(ref.state_dict())
    zopt.load_state_dict(ropt.state_dict())
    train(model, zopt, 2, first=STEPS)
    train(ref, ropt, 2, first=STEPS)
    assert_same_params(model, ref, tolerance({}), "after loading a plain state dict", alone=S == 1)


def no_consolidation():
    model, zopt, _, _ = pair("sgd", 1)
    train(model, zopt, 1)
    if S > 1:
        raises(RuntimeError, zopt.state_dict, "not consolidated on this rank")


def family_save(directory):
    def save():
        model, zopt, ref, ropt = pair("adam", 2)
        train(model, zopt, STEPS)
        path = zopt.save_sharded_state_dict(directory)
        assert os.path.basename(path) == f"zero-shard-{R:05d}-of-{S:05d}.pt"
        zopt.consolidate_state_dict(to=0)
        if R == 0:
            torch.save({"model": model.state_dict(), "optimizer": zopt.state_dict()},
                       os.path.join(directory, "full.pt"))
    chk.check(f"save sharded at np {S}", save)


def family_load(directory):
    def load():
        saved = torch.load(os.path.join(directory, "full.pt"), weights_only=True)
        model, zopt, ref, ropt = pair("adam", 2)
        model.load_state_dict(saved["model"])
        ref.load_state_dict(saved["model"])
        zopt.load_sharded_state_dict(directory)
        ropt.load_state_dict(saved["optimizer"])
        zopt.consolidate_state_dict(to=0)
        if R == 0:
            assert_same_state(zopt.state_dict(), saved["optimizer"], f"sharded checkpoint loaded at np {S}")
        train(model, zopt, 2, first=STEPS)
        train(ref, ropt, 2, first=STEPS)
        assert_same_params(model, ref, tolerance({}), f"steps after loading at np {S}", alone=S == 1)
    chk.check(f"load sharded at np {S}", load)


# ---------------------------------------------------------------- errors

def family_errors():
    def differing_params():
        model = Net()
        extra = [torch.nn.Parameter(torch.zeros(3))] if R == 1 else []
        raises(TensorMismatchError, lambda: DistributedOptimizer(torch.optim.SGD(groups(model, extra), lr=0.1),
                                                                 zero_stage=1),
               "9 parameters on rank 1, 8 on rank 0")

    def lbfgs_everywhere():
        model = Net()
        raises(NotSupportedError, lambda: DistributedOptimizer(torch.optim.LBFGS(model.parameters()), zero_stage=1),
               "LBFGS cannot step on a shard")

    def lbfgs_on_one_rank():
        model = Net()
        opt = torch.optim.LBFGS(model.parameters()) if R == 1 else torch.optim.SGD(model.parameters(), lr=0.1)
        raises(NotSupportedError, lambda: DistributedOptimizer(opt, zero_stage=2), "LBFGS cannot step on a shard")

    def muon():
        opt = torch.optim.Muon([torch.nn.Parameter(torch.zeros(4, 4))])
        raises(NotSupportedError, lambda: DistributedOptimizer(opt, zero_stage=1), "Muon cannot step")

    def adasum():
        raises(NotSupportedError, lambda: DistributedOptimizer(torch.optim.SGD(Net().parameters(), lr=0.1),
                                                               op=hvd.Adasum, zero_stage=1), "op=Adasum")

    def bad_stage():
        raises(InvalidArgumentError, lambda: DistributedOptimizer(torch.optim.SGD(Net().parameters(), lr=0.1),
                                                                  zero_stage=3), "zero_stage must be 0")

    def sparse():
        emb = torch.nn.Embedding(10, 4, sparse=True)
        opt = DistributedOptimizer(torch.optim.SGD(emb.parameters(), lr=0.1), zero_stage=2)
        raises(NotSupportedError, lambda: emb(torch.tensor([1, 2])).sum().backward(), "sparse_as_dense=True")
        dense = torch.nn.Embedding(10, 4, sparse=True)
        ref = copy.deepcopy(dense)
        opt = DistributedOptimizer(torch.optim.SGD(dense.parameters(), lr=0.1), zero_stage=2, sparse_as_dense=True)
        ropt = DistributedOptimizer(torch.optim.SGD(ref.parameters(), lr=0.1), sparse_as_dense=True)
        for m, o in ((dense, opt), (ref, ropt)):
            m(torch.tensor([R, 5])).sum().backward()
            o.step()
        assert torch.equal(dense.weight, ref.weight)

    for name, fn in [("differing parameter lists", differing_params), ("LBFGS", lbfgs_everywhere),
                     ("LBFGS on rank 1 only", lbfgs_on_one_rank), ("Muon", muon), ("Adasum", adasum),
                     ("zero_stage=3", bad_stage), ("sparse gradients", sparse)]:
        chk.check(f"errors: {name}", fn)


# ---------------------------------------------------------------- sets

def family_sets():
    def sets():
        ps = hvd.add_process_set([0, 1])
        try:
            model, zopt, ref, ropt = pair("adam", 2, process_set=ps)
            train(model, zopt, STEPS)
            train(ref, ropt, STEPS)
            assert_same_params(model, ref, None, "process set", alone=R >= 2)
            if R < 2:
                assert zopt._ranks == 2 and zopt.shard_state_numel() == 2 * sum(b.length for b in zopt._buckets) // 2
        finally:
            hvd.remove_process_set(ps)
    chk.check("process set of ranks 0 and 1", sets)


FAMILIES = {"equiv": family_equiv, "more": family_more, "clip": family_clip, "ckpt": family_ckpt,
            "errors": family_errors, "sets": family_sets, "reuse": family_reuse}


def main():
    global R, S, chk
    hvd.init()
    R, S = hvd.rank(), hvd.size()
    chk = Checker(R)
    for fam in sys.argv[1:]:
        what, _, arg = fam.partition(":")
        {"save": family_save, "load": family_load}[what](arg) if arg else FAMILIES[what]()
    hvd.shutdown()
    chk.finish()


if __name__ == "__main__":
    main()
