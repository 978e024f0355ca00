"""torch.autograd Functions for the differentiable collectives (Horovod's gradients).

Backward collectives are named ``<forward name>.grad`` when the forward call was named, and
get automatic names otherwise (every rank runs backward in the same order, so they agree).
They run in the forward call's process set (``ps``; None: every rank).
"""
import torch

from collectives import basics
from collectives.constants import Average, Sum
from collectives.process_sets import set_rank, set_size

from . import ops as raw


def needs_graph(tensors):
    """Whether autograd must record a collective on ``tensors``: a gradient can flow back to one
    of them. Otherwise a Function's ``apply`` only adds its own cost (10 us per call on the 2-core
    VM, a fifth of a small ``allreduce`` through collectives.torch) and its output would not
    require grad either, so the callers run the forward directly. Tensor subclasses always take
    ``apply``, which gives their ``__torch_function__`` its say."""
    return torch.is_grad_enabled() and any(type(t) is not torch.Tensor or t.requires_grad for t in tensors)


def _grad_name(name, suffix="grad"):
    return f"{name}.{suffix}" if name else None


class AllreduceFn(torch.autograd.Function):
    """y = post * op_r(pre * x_r); dx = the same allreduce of dy (Average -> Average, Sum -> Sum)."""

    @staticmethod
    def forward(ctx, tensor, op, name, prescale_factor, postscale_factor, ps):
        ctx.args = (op, name, prescale_factor, postscale_factor, ps)
        return raw.allreduce(tensor, op, name, prescale_factor, postscale_factor, ps)

    @staticmethod
    def backward(ctx, grad_output):
        op, name, pre, post, ps = ctx.args
        return raw.allreduce(grad_output, op, _grad_name(name), pre, post, ps), None, None, None, None, None


class GroupedAllreduceFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, op, name, prescale_factor, postscale_factor, ps, *tensors):
        ctx.args = (op, name, prescale_factor, postscale_factor, ps)
        return tuple(raw.grouped_allreduce(tensors, op, name, prescale_factor, postscale_factor, ps))

    @staticmethod
    def backward(ctx, *grad_outputs):
        op, name, pre, post, ps = ctx.args
        grads = raw.grouped_allreduce(grad_outputs, op, _grad_name(name), pre, post, ps)
        return (None, None, None, None, None, *grads)


def _my_slice(grad_reduced, dim0, shape, name, ps):
    """This rank's rows of an allgathered gradient (ranks' first dimensions may differ)."""
    dims = raw.allgather(torch.tensor([dim0], dtype=torch.int64), _grad_name(name, "grad.dims"), ps)
    offset = int(dims[:set_rank(ps)].sum())
    return grad_reduced.narrow(0, offset, dim0).reshape(shape)


class AllgatherFn(torch.autograd.Function):
    """dx = this rank's rows of allreduce_Average(dy) (Horovod's choice: in data-parallel
    training every rank's loss is one term of the mean loss)."""

    @staticmethod
    def forward(ctx, tensor, name, ps):
        ctx.shape = tensor.shape
        ctx.dim0 = tensor.shape[0] if tensor.dim() > 0 else 1
        ctx.name = name
        ctx.ps = ps
        return raw.allgather(tensor, name, ps)

    @staticmethod
    def backward(ctx, grad_output):
        reduced = raw.allreduce(grad_output, Average, _grad_name(ctx.name), process_set=ctx.ps)
        return _my_slice(reduced, ctx.dim0, ctx.shape, ctx.name, ctx.ps), None, None


class GroupedAllgatherFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, name, ps, *tensors):
        ctx.shapes = [t.shape for t in tensors]
        ctx.name = name
        ctx.ps = ps
        return tuple(raw.grouped_allgather(tensors, name, ps))

    @staticmethod
    def backward(ctx, *grad_outputs):
        name, ps = ctx.name, ctx.ps
        reduced = raw.grouped_allreduce(grad_outputs, Average, _grad_name(name), process_set=ps)
        dim0s = torch.tensor([s[0] if len(s) else 1 for s in ctx.shapes], dtype=torch.int64)
        dims = raw.allgather(dim0s.reshape(1, -1), _grad_name(name, "grad.dims"), ps)  # (n, tensors)
        offsets = dims[:set_rank(ps)].sum(dim=0)
        grads = [r.narrow(0, int(off), int(d)).reshape(shape)
                 for r, off, d, shape in zip(reduced, offsets, dim0s, ctx.shapes)]
        return (None, None, *grads)


class BroadcastFn(torch.autograd.Function):
    """dx = allreduce_Average(dy) on the root, zeros elsewhere (as Horovod)."""

    @staticmethod
    def forward(ctx, tensor, root_rank, name, ps):
        ctx.root_rank = root_rank
        ctx.name = name
        ctx.ps = ps
        return raw.broadcast(tensor, root_rank, name, ps)

    @staticmethod
    def backward(ctx, grad_output):
        reduced = raw.allreduce(grad_output, Average, _grad_name(ctx.name), process_set=ctx.ps)
        if basics.rank() != ctx.root_rank:  # root_rank is a global rank, as in Horovod
            reduced = torch.zeros_like(reduced)
        return reduced, None, None, None


class AlltoallFn(torch.autograd.Function):
    """dx = alltoall(dy) with the received splits (the rows go back where they came from); rows
    after the splits' sum were not sent and get zeros."""

    @staticmethod
    def forward(ctx, tensor, splits, name, ps):
        output, received_splits = raw.alltoall(tensor, splits, name, ps)
        ctx.received_splits = received_splits
        ctx.name = name
        ctx.ps = ps
        ctx.input_rows = tensor.shape[0] if tensor.dim() else 1
        ctx.mark_non_differentiable(received_splits)
        return output, received_splits

    @staticmethod
    def backward(ctx, grad_output, _grad_splits):
        grad, _ = raw.alltoall(grad_output, ctx.received_splits, _grad_name(ctx.name), ctx.ps)
        unsent = ctx.input_rows - grad.shape[0]
        if unsent > 0:
            grad = torch.cat([grad, grad.new_zeros((unsent,) + tuple(grad.shape[1:]))])
        return grad, None, None, None


def _reducescatter_grad_scale(op, pre, post, ps):
    # Horovod's convention (as for allreduce, whose Sum gradient is the Sum of the upstream
    # gradients): the upstream gradient times the set's size for Sum, unscaled for Average,
    # then times both scale factors.
    scale = float(pre) * float(post)
    if op == Sum:
        scale *= set_size(ps)
    return scale


class ReducescatterFn(torch.autograd.Function):
    """dx = allgather(dy), times the set's size for Sum, times pre*post (Horovod's gradient)."""

    @staticmethod
    def forward(ctx, tensor, op, name, prescale_factor, postscale_factor, ps):
        ctx.args = (op, name, prescale_factor, postscale_factor, ps)
        return raw.reducescatter(tensor, op, name, prescale_factor, postscale_factor, ps)

    @staticmethod
    def backward(ctx, grad_output):
        op, name, pre, post, ps = ctx.args
        grad = raw.allgather(grad_output, _grad_name(name), ps)
        scale = _reducescatter_grad_scale(op, pre, post, ps)
        if scale != 1.0:
            grad = grad * scale
        return grad, None, None, None, None, None


class GroupedReducescatterFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, op, name, prescale_factor, postscale_factor, ps, *tensors):
        ctx.args = (op, name, prescale_factor, postscale_factor, ps)
        return tuple(raw.grouped_reducescatter(tensors, op, name, prescale_factor, postscale_factor, ps))

    @staticmethod
    def backward(ctx, *grad_outputs):
        op, name, pre, post, ps = ctx.args
        grads = raw.grouped_allgather(grad_outputs, _grad_name(name), ps)
        scale = _reducescatter_grad_scale(op, pre, post, ps)
        if scale != 1.0:
            grads = [g * scale for g in grads]
        return (None, None, None, None, None, *grads)
