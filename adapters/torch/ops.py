"""The collective verbs on torch tensors without autograd: each converts its tensors to numpy
views (adapters.torch.tensors), calls the framework-agnostic verbs of ``collectives.ops`` and
returns a TorchHandle whose result is a torch tensor of the input's dtype. ``process_set``
(None: every rank) is passed through unchanged."""
import numpy as np
import torch

from collectives import ops as _ops
from collectives.process_sets import set_size

from .tensors import TorchHandle, from_numpy, to_numpy
# wait, not the public synchronize: that one releases the handle (Horovod's), these wait once
# on handles of their own and need nothing else.
from .tensors import wait


def _same_tensor(tensor):
    return lambda _: tensor


# ---------------------------------------------------------------- allreduce

def allreduce_async(tensor, op, name=None, prescale_factor=1.0, postscale_factor=1.0, process_set=None):
    h = _ops.allreduce_async(to_numpy(tensor, "allreduce"), op, name, prescale_factor, postscale_factor, process_set)
    return TorchHandle(h, from_numpy, tensor)


def allreduce_async_(tensor, op, name=None, prescale_factor=1.0, postscale_factor=1.0, process_set=None):
    h = _ops.allreduce_async_(to_numpy(tensor, "allreduce_"), op, name, prescale_factor, postscale_factor,
                              process_set)
    return TorchHandle(h, _same_tensor(tensor), tensor)


def allreduce(tensor, op, name=None, prescale_factor=1.0, postscale_factor=1.0, process_set=None):
    """Synchronous allreduce into a new tensor. A CPU tensor takes the core's synchronous verb, whose
    waiting caller runs the engine's cycles itself (csrc/core/engine_inline.cc) and which builds no
    Handle objects."""
    array = to_numpy(tensor, "allreduce")
    if isinstance(array, torch.Tensor):  # CUDA: the GPU path's handle
        return wait(allreduce_async(tensor, op, name, prescale_factor, postscale_factor, process_set))
    return from_numpy(_ops.allreduce(array, op, name, prescale_factor, postscale_factor, process_set))


def allreduce_(tensor, op, name=None, prescale_factor=1.0, postscale_factor=1.0, process_set=None):
    """Synchronous in-place allreduce; returns ``tensor``. As ``allreduce``: 37 -> 25 us per 8-byte
    call on one rank (the Python and the hand-offs of wait(allreduce_async_))."""
    array = to_numpy(tensor, "allreduce_")
    if isinstance(array, torch.Tensor):  # CUDA: the GPU path's handle
        return wait(allreduce_async_(tensor, op, name, prescale_factor, postscale_factor, process_set))
    _ops.allreduce_(array, op, name, prescale_factor, postscale_factor, process_set)
    return tensor


def grouped_allreduce_async(tensors, op, name=None, prescale_factor=1.0, postscale_factor=1.0, process_set=None):
    tensors = list(tensors)
    arrays = [to_numpy(t, "grouped_allreduce") for t in tensors]
    h = _ops.grouped_allreduce_async(arrays, op, name, prescale_factor, postscale_factor, process_set)
    # A tuple, as Horovod's grouped handles give (its grouped_allreduce makes a list of it).
    return TorchHandle(h, lambda results: tuple(from_numpy(r) for r in results), tensors)


def grouped_allreduce_async_(tensors, op, name=None, prescale_factor=1.0, postscale_factor=1.0, process_set=None):
    tensors = list(tensors)
    arrays = [to_numpy(t, "grouped_allreduce_") for t in tensors]
    h = _ops.grouped_allreduce_async_(arrays, op, name, prescale_factor, postscale_factor, process_set)
    return TorchHandle(h, lambda _: tuple(tensors), tensors)  # a tuple, as Horovod's


def grouped_allreduce(tensors, op, name=None, prescale_factor=1.0, postscale_factor=1.0, process_set=None):
    """Synchronous, through the core's synchronous verb (no TorchHandle); a tuple, as Horovod's."""
    arrays = [to_numpy(t, "grouped_allreduce") for t in tensors]
    results = _ops.grouped_allreduce(arrays, op, name, prescale_factor, postscale_factor, process_set)
    return tuple(from_numpy(r) for r in results)


def grouped_allreduce_(tensors, op, name=None, prescale_factor=1.0, postscale_factor=1.0, process_set=None):
    """Synchronous in place, as ``grouped_allreduce``; returns the tensors as a tuple."""
    tensors = list(tensors)
    arrays = [to_numpy(t, "grouped_allreduce_") for t in tensors]
    _ops.grouped_allreduce_(arrays, op, name, prescale_factor, postscale_factor, process_set)
    return tuple(tensors)


# ---------------------------------------------------------------- broadcast

def broadcast_async(tensor, root_rank, name=None, process_set=None):
    h = _ops.broadcast_async(to_numpy(tensor, "broadcast"), root_rank, name, process_set)
    return TorchHandle(h, from_numpy, tensor)


def broadcast_async_(tensor, root_rank, name=None, process_set=None):
    h = _ops.broadcast_async_(to_numpy(tensor, "broadcast_"), root_rank, name, process_set)
    return TorchHandle(h, _same_tensor(tensor), tensor)


def broadcast(tensor, root_rank, name=None, process_set=None):
    return wait(broadcast_async(tensor, root_rank, name, process_set))


# ---------------------------------------------------------------- allgather

def allgather_async(tensor, name=None, process_set=None):
    h = _ops.allgather_async(to_numpy(tensor, "allgather"), name, process_set)
    return TorchHandle(h, from_numpy, tensor)


def allgather(tensor, name=None, process_set=None):
    return wait(allgather_async(tensor, name, process_set))


def grouped_allgather_async(tensors, name=None, process_set=None):
    tensors = list(tensors)
    arrays = [to_numpy(t, "grouped_allgather") for t in tensors]
    h = _ops.grouped_allgather_async(arrays, name, process_set)
    return TorchHandle(h, lambda results: tuple(from_numpy(r) for r in results), tensors)  # as Horovod's


def grouped_allgather(tensors, name=None, process_set=None):
    return wait(grouped_allgather_async(tensors, name, process_set))


# ---------------------------------------------------------------- alltoall

def _split_list(tensor, splits, process_set):
    if splits is None:
        # Equal parts, made explicit so the received splits are always known (for backward).
        n = set_size(process_set)
        dim0 = tensor.shape[0] if tensor.dim() > 0 else 0
        return None if dim0 % n else [dim0 // n] * n
    # The core checks the splits (collectives/arguments.py) inside its shared-failure guard, so a
    # float splits tensor on one rank fails every rank: hand them over unconverted.
    if isinstance(splits, torch.Tensor):
        splits = splits.detach().cpu().reshape(-1)
        try:
            return splits.numpy()
        except TypeError:  # no numpy type (bfloat16, the float8s, complex32): refused all the same
            return splits.to(torch.complex64 if splits.is_complex() else torch.float32).numpy()
    return np.asarray(splits).reshape(-1)


def alltoall_async(tensor, splits=None, name=None, process_set=None):
    """Always resolves to ``(output, received_splits)`` (an int32 tensor)."""
    split_list = _split_list(tensor, splits, process_set)
    h = _ops.alltoall_async(to_numpy(tensor, "alltoall"), split_list, name, process_set)
    if split_list is None:  # the engine raises (dim0 not divisible); keep a uniform result anyway
        return TorchHandle(h, lambda res: (from_numpy(res[0]), None), tensor)
    return TorchHandle(h, lambda res: (from_numpy(res[0]), from_numpy(np.asarray(res[1], dtype=np.int32))), tensor)


def alltoall(tensor, splits=None, name=None, process_set=None):
    return wait(alltoall_async(tensor, splits, name, process_set))


# ---------------------------------------------------------------- reducescatter

def reducescatter_async(tensor, op, name=None, prescale_factor=1.0, postscale_factor=1.0, process_set=None):
    h = _ops.reducescatter_async(to_numpy(tensor, "reducescatter"), op, name, prescale_factor, postscale_factor,
                                 process_set)
    return TorchHandle(h, from_numpy, tensor)


def reducescatter(tensor, op, name=None, prescale_factor=1.0, postscale_factor=1.0, process_set=None):
    return wait(reducescatter_async(tensor, op, name, prescale_factor, postscale_factor, process_set))


def grouped_reducescatter_async(tensors, op, name=None, prescale_factor=1.0, postscale_factor=1.0,
                                process_set=None):
    tensors = list(tensors)
    arrays = [to_numpy(t, "grouped_reducescatter") for t in tensors]
    h = _ops.grouped_reducescatter_async(arrays, op, name, prescale_factor, postscale_factor, process_set)
    return TorchHandle(h, lambda results: tuple(from_numpy(r) for r in results), tensors)  # as Horovod's


def grouped_reducescatter(tensors, op, name=None, prescale_factor=1.0, postscale_factor=1.0, process_set=None):
    return wait(grouped_reducescatter_async(tensors, op, name, prescale_factor, postscale_factor,
                                            process_set))
