"""collectives.torch.SyncBatchNorm on real ranks (run under mpirun).

Every rank generates the same seeded global batch, takes its own rows (uneven sizes, and
an empty share in some cases), and compares SyncBatchNorm on its rows with
torch.nn.BatchNorm{1,2,3}d on the whole batch, computed by the rank itself:

  - output rows, input gradient rows, running_mean / running_var / num_batches_tracked,
    and the weight / bias gradients summed over ranks (each rank's are the contribution of
    its own rows, as in Horovod), over a few steps with the affine parameters updated;
  - eval mode afterwards (plain batch norm on the local rows);
  - (N, C), (N, C, L), (N, C, H, W), (N, C, D, H, W); float32, float64, bfloat16, float16;
    momentum=None, affine=False, track_running_stats=False, an input that needs no gradient;
  - a DistributedOptimizer training run with SyncBatchNorm against one process on the whole
    batch with BatchNorm2d; convert_sync_batchnorm; errors raised on every rank alike.

The loss is sum(y * G) for a seeded G, so the whole-batch loss is the sum of the ranks' losses.
"""
import sys

import torch

import collectives.torch as hvd
from collectives.adapters.torch.sync_batch_norm import SyncBatchNorm
from common import Checker

torch.set_num_threads(1)
R = S = None
chk = None
CHANNELS = 3
REFERENCE = {2: torch.nn.BatchNorm1d, 3: torch.nn.BatchNorm1d, 4: torch.nn.BatchNorm2d, 5: torch.nn.BatchNorm3d}
TAILS = {"(N,C)": (), "(N,C,L)": (5,), "(N,C,H,W)": (3, 4), "(N,C,D,H,W)": (2, 3, 2)}
# (rtol, atol) per dtype; half precisions are compared with a float32 reference on the same rounded input
TOLERANCE = {torch.float32: (1e-5, 1e-5), torch.float64: (1e-12, 1e-12),
             torch.bfloat16: (2e-2, 2e-2), torch.float16: (4e-3, 4e-3)}
HALF = (torch.bfloat16, torch.float16)


def uneven_sizes(with_empty=False):
    """Rows per rank: all different, or with rank 1 holding none."""
    sizes = [3, 5, 2, 4][:S]
    if with_empty:
        sizes[1] = 0
    return sizes


def my_rows(sizes):
    lo = sum(sizes[:R])
    return slice(lo, lo + sizes[R])


def seeded(seed, shape, dtype, scale=1.0, shift=0.0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(shape, generator=g, dtype=torch.float64) * scale + shift).to(dtype)


def sum_over_ranks(t, name):
    return hvd.allreduce(t.detach().clone(), op=hvd.Sum, name=name)


class Mismatches:
    """Collects comparison failures of one case and raises them at its end, so that a rank
    whose numbers are wrong still makes every collective call of the case (raising at the
    first mismatch would leave the other ranks waiting for it)."""

    def __init__(self):
        self.messages = []

    def close(self, actual, expected, dtype, what):
        rtol, atol = TOLERANCE[dtype]
        try:
            torch.testing.assert_close(actual.detach().to(expected.dtype), expected.detach(), rtol=rtol,
                                       atol=atol, msg=lambda m: f"{what}: {m}")
        except AssertionError as e:
            self.messages.append(str(e))

    def expect(self, condition, what):
        if not condition:
            self.messages.append(what)

    def raise_any(self):
        if self.messages:
            raise AssertionError("\n".join(self.messages))


def compare_training(tail, dtype=torch.float32, sizes=None, steps=3, momentum=0.1, affine=True, track=True,
                     input_grad=True, tag=""):
    sizes = sizes or uneven_sizes()
    rows = my_rows(sizes)
    ref_dtype = torch.float32 if dtype in HALF else dtype
    kw = dict(momentum=momentum, affine=affine, track_running_stats=track)
    ref = REFERENCE[2 + len(tail)](CHANNELS, dtype=ref_dtype, **kw)
    sbn = SyncBatchNorm(CHANNELS, dtype=ref_dtype, **kw)
    if affine:  # not the initial ones/zeros, so that weight and bias matter
        with torch.no_grad():
            for m in (ref, sbn):
                m.weight.copy_(seeded(1, CHANNELS, ref_dtype, 0.5, 1.0))
                m.bias.copy_(seeded(2, CHANNELS, ref_dtype))
    shape = (sum(sizes), CHANNELS, *tail)
    found = Mismatches()
    close = found.close
    for step in range(steps):
        # mean far from 0 and a per-step scale: statistics that are easy to get wrong
        x = seeded(10 + step, shape, dtype, 2.0 + step, 3.0)
        g = seeded(20 + step, shape, dtype)
        x_ref = x.to(ref_dtype).clone().requires_grad_(input_grad)
        y_ref = ref(x_ref)
        (y_ref * g.to(ref_dtype)).sum().backward()
        x_mine = x[rows].clone().requires_grad_(input_grad)
        y = sbn(x_mine)
        found.expect(y.dtype == dtype and y.shape == x_mine.shape, f"output {y.dtype} {list(y.shape)}")
        (y * g[rows]).sum().backward()

        close(y, y_ref[rows], dtype, f"step {step} output")
        if input_grad:
            close(x_mine.grad, x_ref.grad[rows], dtype, f"step {step} input grad")
        if affine:
            w_grad = sum_over_ranks(sbn.weight.grad, f"sbn.test.{tag}.{step}.w")
            b_grad = sum_over_ranks(sbn.bias.grad, f"sbn.test.{tag}.{step}.b")
            close(w_grad, ref.weight.grad, ref_dtype, f"step {step} weight grad")
            close(b_grad, ref.bias.grad, ref_dtype, f"step {step} bias grad")
            with torch.no_grad():  # the same SGD step on both, so later steps see new parameters
                ref.weight -= 0.1 * ref.weight.grad
                ref.bias -= 0.1 * ref.bias.grad
                sbn.weight -= 0.1 * w_grad
                sbn.bias -= 0.1 * b_grad
            for m in (ref, sbn):
                m.weight.grad = m.bias.grad = None
        if track:
            close(sbn.running_mean, ref.running_mean, ref_dtype, f"step {step} running_mean")
            close(sbn.running_var, ref.running_var, ref_dtype, f"step {step} running_var")
            found.expect(int(sbn.num_batches_tracked) == int(ref.num_batches_tracked) == step + 1,
                         f"num_batches_tracked {int(sbn.num_batches_tracked)} at step {step}")
        else:
            found.expect(sbn.running_mean is None and sbn.running_var is None, "running stats exist")

    ref.eval()
    sbn.eval()
    x = seeded(99, shape, dtype, 2.0, 1.0)
    if sizes[R] > 0:
        with torch.no_grad():
            close(sbn(x[rows]), ref(x[rows].to(ref_dtype)), dtype, "eval output")
    found.raise_any()


def family_shapes():
    for label, tail in TAILS.items():
        for dtype in (torch.float32, torch.float64):
            chk.check(f"{label} {dtype}", lambda t=tail, d=dtype: compare_training(t, d, tag=f"{len(t)}.{d}"))
    chk.check("(N,C,H,W) with an empty rank",
              lambda: compare_training(TAILS["(N,C,H,W)"], sizes=uneven_sizes(with_empty=True), tag="empty"))
    chk.check("(N,C) with an empty rank",
              lambda: compare_training((), torch.float64, sizes=uneven_sizes(with_empty=True), tag="empty1"))


def family_options():
    tail = TAILS["(N,C,L)"]
    chk.check("momentum=None (cumulative average)", lambda: compare_training(tail, momentum=None, steps=4, tag="cma"))
    chk.check("affine=False", lambda: compare_training(tail, affine=False, tag="noaffine"))
    chk.check("track_running_stats=False", lambda: compare_training(tail, track=False, tag="notrack"))
    chk.check("input without gradient", lambda: compare_training(tail, input_grad=False, tag="nograd"))
    for dtype in HALF:
        chk.check(f"{dtype} input", lambda d=dtype: compare_training(TAILS["(N,C,H,W)"], d, tag=f"half.{d}"))

    def stacked_widths():
        # two layers of different widths one after the other, twice: names must not collide
        a, b = SyncBatchNorm(4), SyncBatchNorm(6)
        lin = torch.nn.Linear(4, 6)
        for _ in range(2):
            x = seeded(5 + R, (3 + R, 4), torch.float32).requires_grad_()
            b(lin(a(x))).square().sum().backward()
        assert x.grad is not None and a.weight.grad is not None
    chk.check("stacked layers of different widths", stacked_widths)


class Net(torch.nn.Module):
    def __init__(self, norm):
        super().__init__()
        torch.manual_seed(0)
        self.conv = torch.nn.Conv2d(2, 4, 3, padding=1)
        self.norm = norm(4)
        self.head = torch.nn.Linear(4 * 5 * 5, 3)

    def forward(self, x):
        return self.head(torch.relu(self.norm(self.conv(x))).flatten(1))


def family_training():
    def with_distributed_optimizer():
        # Equal shares and a mean loss per rank: averaging the ranks' gradients then gives the
        # gradient of the whole batch's mean loss (see the module docstring of sync_batch_norm).
        per_rank = 3
        model, ref = Net(SyncBatchNorm), Net(torch.nn.BatchNorm2d)
        ref.load_state_dict(model.state_dict())
        opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9),
                                       named_parameters=model.named_parameters())
        ref_opt = torch.optim.SGD(ref.parameters(), lr=0.1, momentum=0.9)
        rows = slice(R * per_rank, (R + 1) * per_rank)
        for step in range(4):
            x = seeded(30 + step, (S * per_rank, 2, 5, 5), torch.float32, 1.5, 0.5)
            y = seeded(40 + step, (S * per_rank, 3), torch.float32)
            ref_opt.zero_grad()
            torch.nn.functional.mse_loss(ref(x), y).backward()
            ref_opt.step()
            opt.zero_grad()
            torch.nn.functional.mse_loss(model(x[rows]), y[rows]).backward()
            opt.step()
        mine, theirs = model.state_dict(), ref.state_dict()
        for key in theirs:
            torch.testing.assert_close(mine[key], theirs[key], rtol=1e-5, atol=1e-6, msg=lambda m: f"{key}: {m}")
    chk.check("DistributedOptimizer + SyncBatchNorm == one process + BatchNorm2d", with_distributed_optimizer)

    def convert():
        model = torch.nn.Sequential(torch.nn.Conv2d(2, 4, 1), torch.nn.BatchNorm2d(4, momentum=None),
                                    torch.nn.Sequential(torch.nn.Flatten(), torch.nn.BatchNorm1d(16, eps=1e-3)))
        model[1].running_mean.fill_(0.5)
        bn1, bn2 = model[1], model[2][1]
        converted = SyncBatchNorm.convert_sync_batchnorm(model)
        assert converted is model  # the container is kept, its children replaced
        new1, new2 = converted[1], converted[2][1]
        assert type(new1) is SyncBatchNorm and type(new2) is SyncBatchNorm
        assert new1.weight is bn1.weight and new1.running_mean is bn1.running_mean and new1.momentum is None
        assert new2.eps == 1e-3 and new2.num_features == 16
        out = converted(seeded(7 + R, (2 + R, 2, 2, 2), torch.float32))
        out.sum().backward()
        assert int(new1.num_batches_tracked) == 1 and new2.weight.grad is not None
        assert type(SyncBatchNorm.convert_sync_batchnorm(torch.nn.BatchNorm1d(3))) is SyncBatchNorm
    chk.check("convert_sync_batchnorm", convert)

    def horovod_name():
        assert hvd.SyncBatchNorm is SyncBatchNorm
        assert isinstance(hvd.SyncBatchNorm(2), torch.nn.modules.batchnorm._BatchNorm)
    chk.check("collectives.torch.SyncBatchNorm", horovod_name)


def family_errors():
    def one_value_in_all():
        sizes = [1] + [0] * (S - 1)
        bn = SyncBatchNorm(2)
        x = seeded(3, (1, 2), torch.float32)[my_rows(sizes)]
        try:
            bn(x)
        except ValueError as e:
            assert "more than 1 value per channel" in str(e), e
        else:
            raise AssertionError("one value per channel over all ranks did not raise")
    chk.check("one value per channel over all ranks raises on every rank", one_value_in_all)

    def wrong_input():
        bn = SyncBatchNorm(3)
        for bad in (torch.zeros(4), torch.zeros(4, 2, 3), torch.zeros(1, 3, 1, 1, 1, 1)):
            try:
                bn(bad)
            except ValueError:
                pass
            else:
                raise AssertionError(f"input of size {list(bad.shape)} did not raise")
        bn(torch.randn(2 + R, 3))  # still usable afterwards, on every rank
    chk.check("wrong input shapes raise before any communication", wrong_input)


FAMILIES = {"shapes": family_shapes, "options": family_options, "training": family_training,
            "errors": family_errors}


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
