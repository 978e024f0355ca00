"""The collective verbs on torch tensors without autograd: each converts its tensors to numpy
views (adapters.torch.tensors), calls the framework-agnostic verbs of ``collectives.ops`` and
returns a TorchHandle whose result is a torch tensor of the input's dtype."""
import numpy as np
import torch

from collectives import basics
from collectives import ops as _ops

from .tensors import TorchHandle, from_numpy, synchronize, to_numpy


def _same_tensor(tensor):
    return lambda _: tensor


# ---------------------------------------------------------------- allreduce

def allreduce_async(tensor, op, name=None, prescale_factor=1.0, postscale_factor=1.0):
    h = _ops.allreduce_async(to_numpy(tensor, "allreduce"), op, name, prescale_factor, postscale_factor)
    return TorchHandle(h, from_numpy, tensor)


def allreduce_async_(tensor, op, name=None, prescale_factor=1.0, postscale_factor=1.0):
    h = _ops.allreduce_async_(to_numpy(tensor, "allreduce_"), op, name, prescale_factor, postscale_factor)
    return TorchHandle(h, _same_tensor(tensor), tensor)


def allreduce(tensor, op, name=None, prescale_factor=1.0, postscale_factor=1.0):
    return synchronize(allreduce_async(tensor, op, name, prescale_factor, postscale_factor))


def grouped_allreduce_async(tensors, op, name=None, prescale_factor=1.0, postscale_factor=1.0):
    tensors = list(tensors)
    arrays = [to_numpy(t, "grouped_allreduce") for t in tensors]
    h = _ops.grouped_allreduce_async(arrays, op, name, prescale_factor, postscale_factor)
    return TorchHandle(h, lambda results: [from_numpy(r) for r in results], tensors)


def grouped_allreduce_async_(tensors, op, name=None, prescale_factor=1.0, postscale_factor=1.0):
    tensors = list(tensors)
    arrays = [to_numpy(t, "grouped_allreduce_") for t in tensors]
    h = _ops.grouped_allreduce_async_(arrays, op, name, prescale_factor, postscale_factor)
    return TorchHandle(h, lambda _: tensors, tensors)


def grouped_allreduce(tensors, op, name=None, prescale_factor=1.0, postscale_factor=1.0):
    return synchronize(grouped_allreduce_async(tensors, op, name, prescale_factor, postscale_factor))


# ---------------------------------------------------------------- broadcast

def broadcast_async(tensor, root_rank, name=None):
    h = _ops.broadcast_async(to_numpy(tensor, "broadcast"), root_rank, name)
    return TorchHandle(h, from_numpy, tensor)


def broadcast_async_(tensor, root_rank, name=None):
    h = _ops.broadcast_async_(to_numpy(tensor, "broadcast_"), root_rank, name)
    return TorchHandle(h, _same_tensor(tensor), tensor)


def broadcast(tensor, root_rank, name=None):
    return synchronize(broadcast_async(tensor, root_rank, name))


# ---------------------------------------------------------------- allgather

def allgather_async(tensor, name=None):
    h = _ops.allgather_async(to_numpy(tensor, "allgather"), name)
    return TorchHandle(h, from_numpy, tensor)


def allgather(tensor, name=None):
    return synchronize(allgather_async(tensor, name))


def grouped_allgather(tensors, name=None):
    base = name or _ops._auto_name("grouped_allgather")
    handles = [allgather_async(t, f"{base}.{i}") for i, t in enumerate(tensors)]
    return [synchronize(h) for h in handles]


# ---------------------------------------------------------------- alltoall

def _split_list(tensor, splits):
    if splits is None:
        # Equal parts, made explicit so the received splits are always known (for backward).
        n = basics.size()
        dim0 = tensor.shape[0] if tensor.dim() > 0 else 0
        return None if dim0 % n else [dim0 // n] * n
    if isinstance(splits, torch.Tensor):
        return [int(s) for s in splits.detach().cpu().reshape(-1).tolist()]
    return [int(s) for s in np.asarray(splits).reshape(-1)]


def alltoall_async(tensor, splits=None, name=None):
    """Always resolves to ``(output, received_splits)`` (an int32 tensor)."""
    split_list = _split_list(tensor, splits)
    h = _ops.alltoall_async(to_numpy(tensor, "alltoall"), split_list, name)
    if split_list is None:  # the engine raises (dim0 not divisible); keep a uniform result anyway
        return TorchHandle(h, lambda out: (from_numpy(out), None), tensor)
    return TorchHandle(h, lambda res: (from_numpy(res[0]), from_numpy(np.asarray(res[1], dtype=np.int32))), tensor)


def alltoall(tensor, splits=None, name=None):
    return synchronize(alltoall_async(tensor, splits, name))


# ---------------------------------------------------------------- reducescatter

def reducescatter_async(tensor, op, name=None, prescale_factor=1.0, postscale_factor=1.0):
    h = _ops.reducescatter_async(to_numpy(tensor, "reducescatter"), op, name, prescale_factor, postscale_factor)
    return TorchHandle(h, from_numpy, tensor)


def reducescatter(tensor, op, name=None, prescale_factor=1.0, postscale_factor=1.0):
    return synchronize(reducescatter_async(tensor, op, name, prescale_factor, postscale_factor))


def grouped_reducescatter(tensors, op, name=None, prescale_factor=1.0, postscale_factor=1.0):
    base = name or _ops._auto_name("grouped_reducescatter")
    handles = [reducescatter_async(t, op, f"{base}.{i}", prescale_factor, postscale_factor)
               for i, t in enumerate(tensors)]
    return [synchronize(h) for h in handles]
