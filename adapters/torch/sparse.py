"""Horovod's "allreduce" of a sparse COO tensor: every rank's indices and values are
allgathered (two engine requests submitted together) and the concatenation is coalesced,
which sums the entries that several ranks hold. Average divides the summed values by the
number of ranks in the set (integer values truncate toward zero, as the engine's integer
Average does).

The handle resolves to a sparse tensor of the input's shape and dtype; as in Horovod it can
also be called (``handle()``) to wait for the result.
"""
import torch

from collectives.constants import Average, Sum
from collectives.errors import InvalidArgumentError
from collectives.process_sets import set_size

from . import ops as raw
from .tensors import TorchHandle


def _check_sparse(tensor, op):
    if not isinstance(tensor, torch.Tensor) or tensor.layout != torch.sparse_coo:
        kind = tensor.layout if isinstance(tensor, torch.Tensor) else type(tensor).__name__
        raise InvalidArgumentError(f"sparse_allreduce_async takes a sparse COO torch.Tensor, got {kind}")
    if op not in (Sum, Average):
        raise NotImplementedError("sparse_allreduce_async supports only the Sum and Average ops (the values are "
                                  "allgathered, not reduced); pass sparse_as_dense=True for others")


class SparseHandle(TorchHandle):
    """Two allgather handles (indices, values) whose result is the coalesced sparse tensor."""

    __slots__ = ("_values_handle", "_shape", "_op", "_ranks")

    def __init__(self, indices_handle, values_handle, like, op, ranks):
        super().__init__(indices_handle, None, like)
        self._values_handle = values_handle
        self._shape = like.shape
        self._op = op
        self._ranks = ranks

    def poll(self):
        return self._done or (self._handle.poll() and self._values_handle.poll())

    def _finished(self):
        # values are waited first; a failure there is the outcome (the indices are not waited)
        return self._done or self._values_handle._finished()

    def wait(self):
        if not self._done:
            values = self._values_handle.wait()
            indices = self._handle.wait()  # (nnz over all ranks, sparse dims)
            result = torch.sparse_coo_tensor(indices.t(), values, self._shape).coalesce()
            if self._op == Average:
                summed = result.values()
                averaged = (summed / self._ranks if summed.is_floating_point()
                            else torch.div(summed, self._ranks, rounding_mode="trunc"))
                result = torch.sparse_coo_tensor(result.indices(), averaged, self._shape, is_coalesced=True)
            self._result = result
            self._done = True
            self._keep_alive = None
        return self._result

    def __call__(self):
        return self.wait()


def sparse_allreduce_async(tensor, name=None, op=Average, process_set=None):
    """Start the sparse reduction of ``tensor`` (see the module docstring); engine names
    ``<name>.indices`` and ``<name>.values`` (automatic names without ``name``)."""
    _check_sparse(tensor, op)
    t = tensor.detach().coalesce()  # fewer entries to send; the result is the same
    indices = t.indices().t().contiguous()  # (nnz, sparse dims): allgather concatenates rows
    values = t.values().contiguous()
    indices_handle = raw.allgather_async(indices, None if name is None else f"{name}.indices", process_set)
    values_handle = raw.allgather_async(values, None if name is None else f"{name}.values", process_set)
    return SparseHandle(indices_handle, values_handle, tensor, op, set_size(process_set))
