"""Horovod's ``horovod.torch.DistributedOptimizer`` on the collectives engine (the broadcasts
live in ``broadcasts``; this module re-exports them).

Gradients are allreduced in place into ``p.grad``. Each parameter's allreduce is started
from ``Tensor.register_post_accumulate_grad_hook`` the moment its gradient is final, so
communication overlaps the rest of the backward pass (the engine fuses what is in flight);
``step()`` waits for all of them, then runs the wrapped optimizer's step.

A model whose gradients are small (fewer bytes in all than ``COLLECTIVES_OVERLAP_MIN_BYTES``,
1 MiB by default) on host tensors is reduced differently: the hooks only note that a gradient
is final, and ``step()`` reduces all of them in one grouped allreduce (its cycles run on the
engine thread, or on the waiting thread when it gets there first: making the wait always run
them, as the synchronous verbs do, was slower in a paired run). Overlap cannot gain such a
model more than its reduction's few tens of microseconds, and each reduction started during
backward costs hand-offs to the engine thread and back on every rank while backward keeps the
cores busy: on the 2-core test machine they made a small CNN's step 2.6-7.8 ms slower than one
reduction in step() (docs/performance.md, "Small models"). The results are the same either way.

Sparse COO gradients (``nn.Embedding(sparse=True)``) are, as in Horovod, allgathered (indices
and values) and coalesced unless ``sparse_as_dense=True``; ``p.grad`` then holds the sparse
result. A rank on which such a parameter got no gradient this step contributes an empty
sparse tensor, once the optimizer has seen that parameter's gradient be sparse (on the first
step it cannot know, and contributes dense zeros, as Horovod does).

Calls go downward only: this module uses the core (``collectives.ops``, ``objects``, ``handles``).
"""
import contextlib
import numbers
import warnings

import torch

from collectives import basics
from collectives import config
from collectives import ops as core
from collectives.constants import Adasum, Average, Sum
from collectives.errors import ArgumentTypeError
from collectives.horovod_util import split_list
from collectives.process_sets import process_set_id, set_size

from .adasum_optimizer import _DistributedAdasumOptimizer, distributed_adasum_optimizer
from .broadcasts import broadcast_optimizer_state, broadcast_parameters  # noqa: F401 - re-exported
from .compression import Compression
from .grad_hooks import register_grad_ready_hooks, remove_hooks, synchronize_before_step
from .sparse import sparse_allreduce_async
from .tensors import to_numpy
from .zero_optimizer import zero_optimizer
from .tensors import wait  # internal handles: waited on without releasing them

__all__ = ["DistributedOptimizer", "broadcast_parameters", "broadcast_optimizer_state", "Compression"]


# ---------------------------------------------------------------- helpers

_SPARSE = object()  # marks a gradient reduced as a sparse tensor (its result replaces p.grad)


# ---------------------------------------------------------------- DistributedOptimizer

class _DistributedOptimizer:
    """Mixin placed before the wrapped optimizer's class in a dynamic subclass."""

    def _distributed_init(self, named_parameters, compression, backward_passes_per_step, op,
                          gradient_predivide_factor, num_groups, groups, sparse_as_dense, process_set):
        process_set_id(process_set)  # an unregistered set raises now; a set without this rank is allowed
        if num_groups:
            warnings.warn("Parameter `num_groups` has been replaced by `groups` and will be removed in v0.23.0.",
                          DeprecationWarning, stacklevel=3)
            if groups is None:
                groups = num_groups
        if gradient_predivide_factor != 1.0 and op != Average:
            raise ValueError("gradient_predivide_factor not supported with op != Average")
        if backward_passes_per_step < 1:
            raise ValueError("backward_passes_per_step must be >= 1")
        self._compression = compression if compression is not None else Compression.none
        self.backward_passes_per_step = int(backward_passes_per_step)
        self.op = op
        self.gradient_predivide_factor = float(gradient_predivide_factor)
        self.sparse_as_dense = sparse_as_dense
        self.process_set = process_set

        all_params = [p for group in self.param_groups for p in group["params"]]
        if named_parameters is not None:
            named_parameters = list(named_parameters)
            if any(not isinstance(p, tuple) for p in named_parameters):
                raise ValueError("named_parameters should be a sequence of tuples (name, parameter), usually "
                                 "produced by model.named_parameters()")
            names = [n for n, _ in named_parameters]
            dups = sorted({n for n in names if names.count(n) > 1})
            if dups:
                raise ValueError(f"Parameter names in named_parameters must be unique. Found duplicates: {dups}")
            self._parameter_names = {p: n for n, p in named_parameters}
            unnamed = [p for p in all_params if p not in self._parameter_names]
            if unnamed:
                raise ValueError("named_parameters was specified, but one or more model parameters were not "
                                 "named. Python object ids: " + ", ".join(str(id(p)) for p in unnamed))
        else:
            self._parameter_names = {p: f"noname.{i}" for i, p in enumerate(all_params)}

        self._requires_update = [p for p in all_params if p.requires_grad]
        self._allreduce_delay = {p: self.backward_passes_per_step for p in self._requires_update}
        # key (param, or tuple of params for a group) -> list of (handle, [(p, compressed, ctx)]),
        # or None while the key has gradients still accumulating
        self._handles = {}
        self._group_counts = {}
        self._p_to_group = {}
        self._submissions = 0   # allreduce submissions so far (for tests and diagnostics)
        self._synchronized = False
        self._should_synchronize = True
        self._hook_handles = []
        self._sparse_dims = {}  # param -> sparse_dim of the sparse gradients it has produced
        self._groups = self._form_groups(groups)
        self._deferred = self._defers(self._requires_update)
        if self._communicates():
            self._register_hooks()

    # -- setup

    def _form_groups(self, groups):
        if groups is None:
            return None
        # Horovod's types: a wrong type (groups='x', 1.5) is its TypeError (ArgumentTypeError is
        # also a ValueError); a bad int (0, -1) and a bool stay a ValueError.
        if not isinstance(groups, (list, tuple, numbers.Integral)):
            raise ArgumentTypeError(f"groups should be a positive integer or a list of lists of torch.Tensor, not "
                                    f"{type(groups).__name__}")
        if isinstance(groups, bool) or (isinstance(groups, numbers.Integral) and groups <= 0):
            raise ValueError("groups should be a positive integer or a list of lists of torch.Tensor")
        if isinstance(groups, numbers.Integral):
            groups = int(groups)
            p_groups = [g for g in split_list(self._requires_update, groups) if g]
        else:
            seen = set()
            p_groups = []
            wanted = set(self._requires_update)
            for group in groups:
                members = []
                for p in group:
                    if not isinstance(p, torch.Tensor):
                        raise ValueError("groups must consist of torch.Tensor")
                    if p in seen:
                        raise ValueError("A parameter can only appear once in groups")
                    seen.add(p)
                    if p in wanted:
                        members.append(p)
                if members:
                    p_groups.append(members)
            p_groups += [[p] for p in self._requires_update if p not in seen]
        result = []
        for group in p_groups:
            group = tuple(group)
            for p in group:
                self._p_to_group[p] = group
            self._group_counts[group] = 0
            result.append(group)
        return result

    def _defers(self, params):
        """Whether step() reduces every gradient at once (module docstring): host parameters
        only (measured on host tensors alone), without user groups
        (they say how to fuse)."""
        if self._groups is not None or not params or any(p.device.type != "cpu" for p in params):
            return False
        return sum(p.numel() * p.element_size() for p in params) < config.read("overlap_min_bytes")

    def _communicates(self):
        """Whether this rank reduces gradients: as in Horovod, a rank outside the process set
        steps on its local gradients, and a set of one has nothing to combine."""
        member = process_set_id(self.process_set) == 0 or bool(self.process_set.included())
        return member and set_size(self.process_set) > 1

    def _register_hooks(self):
        self._hook_handles += register_grad_ready_hooks(self, self._requires_update)

    def _remove_hooks(self):
        """Detach from the parameters (the optimizer no longer communicates)."""
        remove_hooks(self._hook_handles)
        self._hook_handles = []

    # -- communication

    def _name(self, p):
        return "allreduce." + self._parameter_names[p]

    def _group_name(self, group):
        return "grouped_allreduce." + self._parameter_names[group[0]] + f".{len(group)}"

    def _scale_args(self):
        if self.op == Average and self.gradient_predivide_factor != 1.0:
            f = self.gradient_predivide_factor
            return Sum, 1.0 / f, f / set_size(self.process_set)
        return self.op, 1.0, 1.0

    def _grad_is_sparse(self, p):
        """Fills in a missing gradient (zeros: this rank still takes part) and tells whether it
        travels as a sparse tensor; with sparse_as_dense, sparse gradients become dense here."""
        if p.grad is None:
            sparse_dim = self._sparse_dims.get(p)
            if sparse_dim is not None and not self.sparse_as_dense:
                indices = torch.empty((sparse_dim, 0), dtype=torch.int64, device=p.device)
                values = torch.empty((0, *p.shape[sparse_dim:]), dtype=p.dtype, device=p.device)
                p.grad = torch.sparse_coo_tensor(indices, values, p.shape)
            else:
                p.grad = torch.zeros_like(p, memory_format=torch.contiguous_format)
        if p.grad.is_sparse:
            self._sparse_dims[p] = p.grad.sparse_dim()
            if not self.sparse_as_dense:
                return True
            p.grad = p.grad.to_dense()
        elif not p.grad.is_contiguous():
            p.grad = p.grad.contiguous()
        return False

    def _prepare_grad(self, p):
        compressed, ctx = self._compression.compress(p.grad)
        return compressed, ctx

    def _allreduce_grad_async(self, p):
        compressed, ctx = self._prepare_grad(p)
        op, pre, post = self._scale_args()
        handle = core.allreduce_async_(to_numpy(compressed), op=op, name=self._name(p),
                                       prescale_factor=pre, postscale_factor=post,
                                       process_set=self.process_set)
        self._submissions += 1
        return handle, [(p, compressed, ctx)]

    def _sparse_allreduce_grad_async(self, p):
        # Horovod's sparse path: the op (Average divides), not the predivide split of _scale_args.
        handle = sparse_allreduce_async(p.grad, name="sparse_allreduce." + self._parameter_names[p], op=self.op,
                                        process_set=self.process_set)
        self._submissions += 1
        return handle, [(p, None, _SPARSE)]

    def _grouped_allreduce_grad_async(self, members):
        prepared = [(p, *self._prepare_grad(p)) for p in members]
        op, pre, post = self._scale_args()
        handle = core.grouped_allreduce_async_([to_numpy(c) for _, c, _ in prepared], op=op,
                                               name=self._group_name(members), prescale_factor=pre,
                                               postscale_factor=post, process_set=self.process_set)
        self._submissions += 1
        return handle, prepared

    def _submit(self, key):
        """Start the reduction of one parameter's or one group's gradients; returns the
        pending (handle, prepared) pairs. In a group, sparse gradients travel on their own
        (every rank has the same ones sparse: it is a property of the model)."""
        params = key if isinstance(key, tuple) else (key,)
        sparse = [self._grad_is_sparse(p) for p in params]
        pending = [self._sparse_allreduce_grad_async(p) for p, is_sparse in zip(params, sparse) if is_sparse]
        dense = [p for p, is_sparse in zip(params, sparse) if not is_sparse]
        if dense:
            if isinstance(key, tuple):
                pending.append(self._grouped_allreduce_grad_async(dense))
            else:
                pending.append(self._allreduce_grad_async(key))
        return pending

    def _on_grad_ready(self, p):
        key = self._p_to_group[p] if self._groups is not None else p
        if self._allreduce_delay[p] <= 0:
            raise AssertionError(
                "Gradients were computed more than backward_passes_per_step times before call to step(). "
                "Increase backward_passes_per_step to accumulate gradients locally.")
        self._allreduce_delay[p] -= 1
        if self._allreduce_delay[p] > 0 or self._deferred:
            self._handles.setdefault(key, None)
            return
        if self._groups is None:
            self._handles[p] = self._submit(p)
            return
        self._group_counts[key] += 1
        if self._group_counts[key] == len(key):
            self._handles[key] = self._submit(key)
            self._group_counts[key] = 0
        else:
            self._handles.setdefault(key, None)

    def synchronize(self):
        """Wait for every gradient allreduce of this step; afterwards ``p.grad`` holds the reduced
        gradients. Parameters whose hook did not fire (unused this step, or fewer backward
        passes than ``backward_passes_per_step``) are reduced now, with zeros where they have
        no gradient, so every rank submits the same names. On a rank outside the process set
        the gradients stay local."""
        if self._communicates():
            if self._deferred:  # one grouped allreduce of every gradient (module docstring)
                self._handles = {"all": self._submit(tuple(self._requires_update))}
            else:
                for key in (self._requires_update if self._groups is None else self._groups):
                    if self._handles.get(key) is None:
                        self._handles[key] = self._submit(key)
                        if self._groups is not None:
                            self._group_counts[key] = 0
            try:
                for pending in self._handles.values():
                    for handle, prepared in pending:
                        result = wait(handle)
                        for p, compressed, ctx in prepared:
                            if ctx is _SPARSE:
                                p.grad = result
                                continue
                            out = self._compression.decompress(compressed, ctx)
                            if out is not p.grad:
                                p.grad.copy_(out)
            finally:
                self._handles.clear()
                for p in self._requires_update:
                    self._allreduce_delay[p] = self.backward_passes_per_step
        self._synchronized = True

    @contextlib.contextmanager
    def skip_synchronize(self):
        """``step()`` inside this block does not synchronize (call ``synchronize()`` first, e.g.
        to clip the reduced gradients)."""
        self._should_synchronize = False
        try:
            yield
        finally:
            self._should_synchronize = True

    def step(self, closure=None):
        synchronize_before_step(self)
        self._synchronized = False
        return super().step(closure)

    def _local_step(self):
        """The wrapped optimizer's own step, without the gradient synchronization (used by
        broadcast_optimizer_state to give a fresh optimizer its state on one rank's terms)."""
        return super().step()

    def zero_grad(self, *args, **kwargs):
        if self._handles:
            raise AssertionError("optimizer.zero_grad() was called after loss.backward() but before "
                                 "optimizer.step() or optimizer.synchronize(). This is prohibited as it can "
                                 "cause a race condition.")
        return super().zero_grad(*args, **kwargs)


def DistributedOptimizer(optimizer, named_parameters=None, compression=None, backward_passes_per_step=1,
                         op=Average, gradient_predivide_factor=1.0, num_groups=0, groups=None, sparse_as_dense=False,
                         process_set=None, zero_stage=0):
    """Wrap a ``torch.optim.Optimizer`` so that gradients are averaged over all ranks.

    Returns an object of a dynamic subclass of the optimizer's class (``isinstance`` and
    ``state_dict`` keep working) sharing the optimizer's parameter groups, state and
    hyperparameters. See Horovod's documentation for the arguments; ``compression=None``
    means no compression. With a ``process_set``, gradients are averaged over its ranks only
    (every member must use the optimizer); on a rank outside the set it steps on the local
    gradients, as in Horovod, so every rank may build one optimizer per set. ``op=Adasum`` on more than
    one rank returns Horovod's delta optimizer instead (``adasum_optimizer``). ``zero_stage=1``
    shards the optimizer state over the set's ranks, ``2`` the gradients too (``zero_optimizer``,
    docs/zero.md).
    """
    if zero_stage != 0:  # sharded state: its own wrapper, which checks every argument collectively
        return zero_optimizer(optimizer, zero_stage, named_parameters, compression, backward_passes_per_step, op,
                              gradient_predivide_factor, num_groups, groups, sparse_as_dense, process_set)
    if isinstance(optimizer, (_DistributedOptimizer, _DistributedAdasumOptimizer)):
        raise ValueError("optimizer is already a DistributedOptimizer")
    if gradient_predivide_factor != 1.0 and op != Average:
        raise ValueError("gradient_predivide_factor not supported with op != Average")
    if op == Adasum and basics.size() > 1:  # Horovod's delta optimizer (adasum_optimizer.py)
        return distributed_adasum_optimizer(optimizer, named_parameters, compression, backward_passes_per_step,
                                            process_set)
    base = optimizer.__class__
    cls = type(base.__name__, (_DistributedOptimizer, base), {"__module__": __name__})
    dist = cls.__new__(cls)
    dist.__dict__.update(optimizer.__dict__)  # param_groups, state, defaults, hooks: shared
    dist._distributed_init(named_parameters, compression, backward_passes_per_step, op, gradient_predivide_factor,
                           num_groups, groups, sparse_as_dense, process_set)
    return dist


