"""Horovod's ``horovod.torch.DistributedOptimizer``, ``broadcast_parameters`` and
``broadcast_optimizer_state`` on the collectives engine.

Gradients are allreduced in place into ``p.grad``. Each parameter's allreduce is started
from ``Tensor.register_post_accumulate_grad_hook`` the moment its gradient is final, so
communication overlaps the rest of the backward pass (the engine fuses what is in flight);
``step()`` waits for all of them, then runs the wrapped optimizer's step.

Calls go downward only: this module uses the core (``collectives.ops``, ``objects``, ``handles``).
"""
import contextlib
import warnings
import weakref

import torch

from collectives import basics, objects
from collectives import ops as core
from collectives.handles import synchronize
from collectives.constants import Adasum, Average, Sum
from collectives.process_sets import set_size

from .compression import Compression
from .mpi_ops import check_process_set
from .tensors import to_numpy

__all__ = ["DistributedOptimizer", "broadcast_parameters", "broadcast_optimizer_state", "Compression"]


# ---------------------------------------------------------------- helpers

def _split_list(items, n):
    d, r = divmod(len(items), n)
    return [items[i * d + min(i, r):(i + 1) * d + min(i + 1, r)] for i in range(n)]


# ---------------------------------------------------------------- DistributedOptimizer

class _DistributedOptimizer:
    """Mixin placed before the wrapped optimizer's class in a dynamic subclass."""

    def _distributed_init(self, named_parameters, compression, backward_passes_per_step, op,
                          gradient_predivide_factor, groups, sparse_as_dense, process_set):
        check_process_set(process_set)
        if op == Adasum:
            raise NotImplementedError("collectives.torch: Adasum is not supported")
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
        self._handles = {}      # key (param, or tuple of params for a group) -> (handle, ctx) or (None, None)
        self._group_counts = {}
        self._p_to_group = {}
        self._submissions = 0   # allreduce submissions so far (for tests and diagnostics)
        self._synchronized = False
        self._should_synchronize = True
        self._hook_handles = []
        self._groups = self._form_groups(groups)
        if set_size(process_set) > 1:
            self._register_hooks()

    # -- setup

    def _form_groups(self, groups):
        if groups is None:
            return None
        if isinstance(groups, bool) or not (isinstance(groups, (list, tuple)) or
                                            (isinstance(groups, int) and groups > 0)):
            raise ValueError("groups should be a positive integer or a list of lists of torch.Tensor")
        if isinstance(groups, int):
            p_groups = [g for g in _split_list(self._requires_update, groups) if g]
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

    def _register_hooks(self):
        ref = weakref.ref(self)

        def hook(p):
            opt = ref()
            if opt is not None:
                opt._on_grad_ready(p)

        for p in self._requires_update:
            self._hook_handles.append(p.register_post_accumulate_grad_hook(hook))

    def _remove_hooks(self):
        """Detach from the parameters (the optimizer no longer communicates)."""
        for h in self._hook_handles:
            h.remove()
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

    def _prepare_grad(self, p):
        if p.grad is None:  # no gradient on this rank this step: contribute zeros
            p.grad = torch.zeros_like(p, memory_format=torch.contiguous_format)
        if p.grad.is_sparse:
            if not self.sparse_as_dense:
                raise NotImplementedError("collectives.torch: sparse gradients need sparse_as_dense=True")
            p.grad = p.grad.to_dense()
        elif not p.grad.is_contiguous():
            p.grad = p.grad.contiguous()
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

    def _grouped_allreduce_grad_async(self, group):
        prepared = [(p, *self._prepare_grad(p)) for p in group]
        op, pre, post = self._scale_args()
        handle = core.grouped_allreduce_async_([to_numpy(c) for _, c, _ in prepared], op=op,
                                                      name=self._group_name(group), prescale_factor=pre,
                                                      postscale_factor=post, process_set=self.process_set)
        self._submissions += 1
        return handle, prepared

    def _on_grad_ready(self, p):
        key = self._p_to_group[p] if self._groups is not None else p
        if self._allreduce_delay[p] <= 0:
            raise AssertionError(
                "Gradients were computed more than backward_passes_per_step times before call to step(). "
                "Increase backward_passes_per_step to accumulate gradients locally.")
        self._allreduce_delay[p] -= 1
        if self._allreduce_delay[p] > 0:
            self._handles.setdefault(key, (None, None))
            return
        if self._groups is None:
            self._handles[p] = self._allreduce_grad_async(p)
            return
        self._group_counts[key] += 1
        if self._group_counts[key] == len(key):
            self._handles[key] = self._grouped_allreduce_grad_async(key)
            self._group_counts[key] = 0
        else:
            self._handles.setdefault(key, (None, None))

    def synchronize(self):
        """Wait for every gradient allreduce of this step; afterwards ``p.grad`` holds the reduced
        gradients. Parameters whose hook did not fire (unused this step, or fewer backward
        passes than ``backward_passes_per_step``) are reduced now, with zeros where they have
        no gradient, so every rank submits the same names."""
        if set_size(self.process_set) > 1:
            if self._groups is None:
                for p in self._requires_update:
                    handle, _ = self._handles.get(p, (None, None))
                    if handle is None:
                        self._handles[p] = self._allreduce_grad_async(p)
            else:
                for group in self._groups:
                    handle, _ = self._handles.get(group, (None, None))
                    if handle is None:
                        self._handles[group] = self._grouped_allreduce_grad_async(group)
                        self._group_counts[group] = 0
            try:
                for handle, prepared in self._handles.values():
                    synchronize(handle)
                    for p, compressed, ctx in prepared:
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
        if self._should_synchronize:
            if self._synchronized:
                warnings.warn("optimizer.step() called without optimizer.skip_synchronize() context after "
                              "optimizer.synchronize(). This can cause training slowdown. You may want to "
                              "consider using optimizer.skip_synchronize() context if you use "
                              "optimizer.synchronize() in your code.")
            self.synchronize()
        self._synchronized = False
        return super().step(closure)

    def zero_grad(self, *args, **kwargs):
        if self._handles:
            raise AssertionError("optimizer.zero_grad() was called after loss.backward() but before "
                                 "optimizer.step() or optimizer.synchronize(). This is prohibited as it can "
                                 "cause a race condition.")
        return super().zero_grad(*args, **kwargs)


def DistributedOptimizer(optimizer, named_parameters=None, compression=None, backward_passes_per_step=1,
                         op=Average, gradient_predivide_factor=1.0, groups=None, sparse_as_dense=False,
                         process_set=None):
    """Wrap a ``torch.optim.Optimizer`` so that gradients are averaged over all ranks.

    Returns an object of a dynamic subclass of the optimizer's class (``isinstance`` and
    ``state_dict`` keep working) sharing the optimizer's parameter groups, state and
    hyperparameters. See Horovod's documentation for the arguments; ``compression=None``
    means no compression. With a ``process_set``, gradients are averaged over its ranks only
    (every member must use the optimizer; other ranks must not).
    """
    if isinstance(optimizer, _DistributedOptimizer):
        raise ValueError("optimizer is already a DistributedOptimizer")
    base = optimizer.__class__
    cls = type(base.__name__, (_DistributedOptimizer, base), {"__module__": __name__})
    dist = cls.__new__(cls)
    dist.__dict__.update(optimizer.__dict__)  # param_groups, state, defaults, hooks: shared
    dist._distributed_init(named_parameters, compression, backward_passes_per_step, op, gradient_predivide_factor,
                           groups, sparse_as_dense, process_set)
    return dist


# ---------------------------------------------------------------- broadcasts

def broadcast_parameters(params, root_rank, process_set=None):
    """Broadcast parameters (a ``state_dict()``-like mapping, or an iterable of ``(name,
    tensor)`` pairs such as ``named_parameters()``, or of bare tensors) from ``root_rank`` to
    every rank, in place."""
    check_process_set(process_set)
    if isinstance(params, dict):
        items = sorted(params.items())
    else:
        items = [p if isinstance(p, tuple) else (None, p) for p in params]
    handles = []
    for name, p in items:
        if not isinstance(p, torch.Tensor):
            raise ValueError(f"broadcast_parameters: {name!r} is a {type(p).__name__}, not a tensor")
        handles.append(core.broadcast_async_(to_numpy(p), root_rank,
                                                    name=None if name is None else f"broadcast.{name}",
                                                    process_set=process_set))
    for h in handles:
        synchronize(h)


def _describe_state(state):
    """Root's optimizer state with tensors replaced by (shape, dtype) placeholders."""
    out = {}
    for pid, entries in state.items():
        desc = {}
        for key, value in entries.items():
            if isinstance(value, torch.Tensor):
                desc[key] = ("tensor", tuple(value.shape), str(value.dtype).replace("torch.", ""), value.device.type)
            else:
                desc[key] = ("value", value)
        out[pid] = desc
    return out


def _state_device(device_type, params, pid):
    """Where a state tensor the root has on ``device_type`` lives here: its parameter's GPU
    (ranks use different ones), or this process's current one; the CPU for CPU state."""
    if device_type != "cuda":
        return torch.device("cpu")
    if isinstance(pid, int) and 0 <= pid < len(params) and params[pid].is_cuda:
        return params[pid].device
    return torch.device("cuda", torch.cuda.current_device())


def broadcast_optimizer_state(optimizer, root_rank, process_set=None):
    """Make every rank's optimizer state and hyperparameters equal to ``root_rank``'s.

    The state's structure, scalars and ``param_groups`` go as one pickled object; the state
    tensors are then broadcast in place (reusing a rank's own tensors where shape and dtype
    agree, allocating where the rank has not stepped yet), and loaded with
    ``load_state_dict`` on the other ranks.
    """
    check_process_set(process_set)
    if isinstance(optimizer, torch.optim.LBFGS):
        raise ValueError("cannot broadcast torch.optim.LBFGS state")
    state_dict = optimizer.state_dict()
    is_root = basics.rank() == root_rank
    desc = None
    if is_root:
        groups = [{k: v for k, v in g.items()} for g in state_dict["param_groups"]]
        desc = {"param_groups": groups, "state": _describe_state(state_dict["state"])}
    desc = objects.broadcast_object(desc, root_rank, name="broadcast_optimizer_state.structure",
                                        process_set=process_set)

    local = state_dict["state"]
    params = [p for group in optimizer.param_groups for p in group["params"]]  # state_dict's ids index these
    new_state, handles = {}, []
    for pid in sorted(desc["state"], key=str):
        entries = {}
        for key in sorted(desc["state"][pid], key=str):
            kind, *rest = desc["state"][pid][key]
            if kind == "value":
                entries[key] = rest[0]
                continue
            shape, dtype = rest[0], getattr(torch, rest[1])
            device = _state_device(rest[2] if len(rest) > 2 else "cpu", params, pid)
            tensor = local.get(pid, {}).get(key)
            if not (isinstance(tensor, torch.Tensor) and tuple(tensor.shape) == shape and tensor.dtype == dtype
                    and tensor.is_contiguous() and tensor.device.type == device.type):
                tensor = torch.empty(shape, dtype=dtype, device=device)
            entries[key] = tensor
            handles.append(core.broadcast_async_(to_numpy(tensor), root_rank,
                                                        name=f"broadcast_optimizer_state.{pid}.{key}",
                                                        process_set=process_set))
        new_state[pid] = entries
    for h in handles:
        synchronize(h)
    if not is_root:
        optimizer.load_state_dict({"state": new_state, "param_groups": desc["param_groups"]})
