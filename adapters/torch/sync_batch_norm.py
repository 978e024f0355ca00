"""Horovod's ``hvd.SyncBatchNorm`` on CPU tensors: batch normalization whose training-mode
statistics are those of the batch formed by every rank's batch together.

Forward (training, more than one rank): each rank computes its count, mean and sum of
squared deviations per channel, the ranks allgather them (float64, one small tensor), and
every rank combines them with Chan et al.'s parallel formula (stable, unlike sum / sum of
squares). Ranks may hold different batch sizes, also 0. The running statistics get torch's
update with the global mean and the global unbiased variance.

Backward: the input gradient of batch norm needs two per-channel sums over the whole batch,
sum(dy) and sum(dy * (x - mean)); one allreduce (Sum) of both gives them. The weight and bias
gradients stay local, as in Horovod and torch.nn.SyncBatchNorm: each rank's is the
contribution of its own rows, and the DistributedOptimizer's allreduce combines them.

Eval mode, and a single rank, run torch's own batch norm (no communication), as
torch.nn.SyncBatchNorm does.
"""
import torch
from torch.nn.modules.batchnorm import _BatchNorm

from collectives import basics
from collectives.constants import Sum

from . import ops as raw

__all__ = ["SyncBatchNorm"]


def _compute_dtype(dtype):
    # Statistics and normalization of half-precision inputs run in float32, as torch's do.
    return torch.float64 if dtype == torch.float64 else torch.float32


def _channel_view(vector, dims):
    """A per-channel vector shaped (1, C, 1, ...) to broadcast against an input of ``dims`` dims."""
    return vector.reshape([1, -1] + [1] * (dims - 2))


def _local_moments(x, reduce_dims):
    """(count, mean, M2) per channel of this rank's rows, M2 = sum((x - mean)^2), in float64.

    Two passes (the mean, then the squared deviations from it): as exact as Welford's
    torch.var_mean and ~4x faster on CPU, and free of sum-of-squares cancellation."""
    channels = x.shape[1]
    count = x.numel() // channels if channels else 0
    if count == 0:
        zeros = torch.zeros(channels, dtype=torch.float64)
        return count, zeros, zeros.clone()
    mean = x.mean(reduce_dims)
    m2 = (x - _channel_view(mean, x.dim())).square_().sum(reduce_dims)
    return count, mean.double(), m2.double()


def _global_moments(x, reduce_dims, name):
    """(total count, mean, biased variance) per channel over every rank's rows (float64).

    Chan's combination: M2 = sum_r M2_r + sum_r n_r (mean_r - mean)^2, exact in exact
    arithmetic and free of the cancellation that sum-of-squares formulas suffer.
    """
    count, mean, m2 = _local_moments(x, reduce_dims)
    mine = torch.cat([torch.tensor([float(count)], dtype=torch.float64), mean, m2]).unsqueeze(0)
    every = raw.allgather(mine, name)  # (ranks, 1 + 2C)
    channels = mean.numel()
    counts = every[:, :1]
    means = every[:, 1:1 + channels]
    m2s = every[:, 1 + channels:]
    total = float(counts.sum())
    if total <= 1:  # every rank sees the same total, so every rank raises
        raise ValueError(f"Expected more than 1 value per channel when training, got {int(total)} over all ranks "
                         f"(input size on this rank {list(x.shape)})")
    global_mean = (counts * means).sum(0) / total
    global_m2 = m2s.sum(0) + (counts * (means - global_mean) ** 2).sum(0)
    return total, global_mean, global_m2 / total


class _SyncBatchNormFunction(torch.autograd.Function):
    """Batch norm with statistics over all ranks; updates the running buffers in forward."""

    @staticmethod
    def forward(ctx, input, weight, bias, running_mean, running_var, eps, average_factor, name):
        compute = _compute_dtype(input.dtype)
        x = input.to(compute)
        dims = x.dim()
        reduce_dims = [0] + list(range(2, dims))
        total, mean, var = _global_moments(x, reduce_dims, f"{name}.stats")

        if running_mean is not None:
            # torch's update: biased variance normalizes, the unbiased one is remembered.
            unbiased = var * (total / (total - 1))
            running_mean.mul_(1 - average_factor).add_(mean.to(running_mean.dtype), alpha=average_factor)
            running_var.mul_(1 - average_factor).add_(unbiased.to(running_var.dtype), alpha=average_factor)

        invstd = torch.rsqrt(var + eps).to(compute)
        mean = mean.to(compute)
        # y = x * scale + shift, per channel: one pass over the input (torch's CPU kernel does the same).
        scale = invstd if weight is None else invstd * weight.to(compute)
        shift = -mean * scale if bias is None else bias.to(compute) - mean * scale
        output = torch.addcmul(_channel_view(shift, dims), x, _channel_view(scale, dims))

        ctx.save_for_backward(input, weight, mean, invstd)
        ctx.total = total
        ctx.name = name
        ctx.bias_dtype = None if bias is None else bias.dtype
        return output.to(input.dtype)

    @staticmethod
    def backward(ctx, grad_output):
        input, weight, mean, invstd = ctx.saved_tensors
        compute = mean.dtype
        dims = input.dim()
        reduce_dims = [0] + list(range(2, dims))
        dy = grad_output.to(compute)
        x_mu = input.to(compute) - _channel_view(mean, dims)
        if dy.numel():
            sum_dy = dy.sum(reduce_dims)
            sum_dy_xmu = (dy * x_mu).sum(reduce_dims)
        else:  # an empty batch on this rank contributes nothing
            sum_dy = torch.zeros_like(mean)
            sum_dy_xmu = torch.zeros_like(mean)

        # Always reduce, even where no input gradient is wanted, so every rank makes the same call.
        sums = raw.allreduce(torch.cat([sum_dy, sum_dy_xmu]).double(), Sum, f"{ctx.name}.grad")
        channels = mean.numel()
        mean_dy, mean_dy_xmu = sums[:channels] / ctx.total, sums[channels:] / ctx.total

        grad_input = grad_weight = grad_bias = None
        if ctx.needs_input_grad[0]:
            # dx = k * (dy - mean(dy) - x_mu * invstd^2 * mean(dy * x_mu)), k = invstd * weight,
            # as dy * k + x_mu * k_mu + k_0: two passes over the input.
            inv = invstd.double()
            k = inv if weight is None else inv * weight.double()
            k_mu = -k * inv * inv * mean_dy_xmu
            k_0 = -k * mean_dy
            view = lambda v: _channel_view(v.to(compute), dims)  # noqa: E731
            grad_input = torch.addcmul(view(k_0), dy, view(k)).addcmul_(x_mu, view(k_mu)).to(input.dtype)
        if weight is not None and ctx.needs_input_grad[1]:
            grad_weight = (sum_dy_xmu * invstd).to(weight.dtype)
        if ctx.bias_dtype is not None and ctx.needs_input_grad[2]:
            grad_bias = sum_dy.to(ctx.bias_dtype)
        return grad_input, grad_weight, grad_bias, None, None, None, None, None


class SyncBatchNorm(_BatchNorm):
    """Batch normalization over the batch of all ranks together (Horovod's ``hvd.SyncBatchNorm``).

    Takes ``torch.nn.SyncBatchNorm``'s arguments but ``process_group``; inputs are (N, C),
    (N, C, L), (N, C, H, W) or (N, C, D, H, W) CPU tensors (float32, float64, float16,
    bfloat16; statistics of half-precision inputs are computed in float32). In training mode
    with more than one rank the statistics are global and every rank must call forward and
    backward for each use of the layer, in the same order. In eval mode it is
    torch's batch norm on the local batch (the running statistics, or, without
    ``track_running_stats``, the local batch's own).
    """

    def __init__(self, num_features, eps=1e-5, momentum=0.1, affine=True, track_running_stats=True,
                 device=None, dtype=None):
        super().__init__(num_features, eps, momentum, affine, track_running_stats, device=device, dtype=dtype)

    def _check_input_dim(self, input):
        if not 2 <= input.dim() <= 5:
            raise ValueError(f"expected a 2D to 5D input (N, C, ...), got a {input.dim()}D input")
        if input.shape[1] != self.num_features:
            # Checked here rather than in the allgather, where it would be a cross-rank mismatch.
            raise ValueError(f"expected {self.num_features} channels (dimension 1), got input of size "
                             f"{list(input.shape)}")

    def _average_factor(self):
        """The running-statistics weight of this batch (torch's rule), counting the batch."""
        if not (self.training and self.track_running_stats):
            return 0.0
        self.num_batches_tracked.add_(1)
        if self.momentum is None:  # cumulative moving average
            return 1.0 / float(self.num_batches_tracked)
        return self.momentum

    def forward(self, input):
        if not self.training or basics.size() == 1:
            return super().forward(input)  # no statistics to share
        self._check_input_dim(input)
        factor = self._average_factor()
        track = self.track_running_stats
        # Named by channel count: ranks agree without knowing which layer this is, and a name
        # always carries the same shape, so the engine's response cache keeps hitting.
        return _SyncBatchNormFunction.apply(
            input, self.weight, self.bias, self.running_mean if track else None,
            self.running_var if track else None, self.eps, factor, f"SyncBatchNorm.{self.num_features}")

    @classmethod
    def convert_sync_batchnorm(cls, module):
        """``module`` with every BatchNorm*d layer replaced by a SyncBatchNorm sharing its
        parameters and buffers (torch.nn.SyncBatchNorm.convert_sync_batchnorm without process
        groups). Returns the new module, or ``module`` itself when it had nothing to replace."""
        converted = module
        if isinstance(module, _BatchNorm) and not isinstance(module, cls):
            converted = cls(module.num_features, module.eps, module.momentum, module.affine,
                            module.track_running_stats)
            if module.affine:
                converted.weight = module.weight
                converted.bias = module.bias
            converted.running_mean = module.running_mean
            converted.running_var = module.running_var
            converted.num_batches_tracked = module.num_batches_tracked
            converted.training = module.training
            if hasattr(module, "qconfig"):
                converted.qconfig = module.qconfig
        for child_name, child in module.named_children():
            converted.add_module(child_name, cls.convert_sync_batchnorm(child))
        return converted
