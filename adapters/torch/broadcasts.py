"""Horovod's ``broadcast_parameters`` and ``broadcast_optimizer_state`` for PyTorch.

``broadcast_optimizer_state`` sends the root's optimizer state as one pickled description
(structure, scalars, ``param_groups``) followed by in-place broadcasts of the state tensors,
so ranks whose state differs in structure from the root's (the root restored a checkpoint,
the others are fresh) still receive it.

As in Horovod, an optimizer without any state yet is first given some: every parameter that
requires a gradient gets a zero gradient (sparse for ``torch.optim.SparseAdam``, and for the
parameters of sparse ``nn.Embedding``/``nn.EmbeddingBag`` modules of ``model``) and the
wrapped optimizer takes one step. Unlike Horovod, the parameters are put back as they were
after that step: an optimizer with weight decay would otherwise shrink them, and a broadcast
of optimizer state should not move the model. An optimizer that still has no state after
that step (SGD without momentum) is stateless: as in Horovod, nothing is broadcast, not even
``param_groups``.
"""
import torch

from collectives import basics, objects
from collectives import ops as core
from collectives.errors import ArgumentTypeError, InvalidArgumentError

from .mpi_ops import check_process_set
from .tensors import to_numpy
from .tensors import wait  # internal handles: waited on without releasing them

__all__ = ["broadcast_parameters", "broadcast_optimizer_state"]


def broadcast_parameters(params, root_rank, process_set=None):
    """Broadcast parameters (a ``state_dict()``-like mapping, or an iterable of ``(name,
    tensor)`` pairs such as ``named_parameters()``, or of bare tensors) from ``root_rank`` to
    every rank, in place.

    The ranks first check that they hold the same parameters (names, shapes, dtypes) as the
    root, with one small allgather: a rank whose state dict differs would otherwise submit
    names the others never submit, and every rank would wait for good. A difference raises
    InvalidArgumentError on every rank, naming the ranks and the parameters."""
    check_process_set(process_set)
    if isinstance(params, dict):
        items = sorted(params.items())
    elif isinstance(params, (torch.Tensor, str, bytes)) or not hasattr(params, "__iter__"):
        # A local mistake (Horovod: ValueError): raised here before any collective call, so
        # every rank making the same call raises it alike. A bare tensor would iterate its rows.
        raise ArgumentTypeError(f"broadcast_parameters takes a state_dict()-like mapping or an iterable of "
                                f"(name, tensor) pairs or tensors, not {type(params).__name__}")
    else:
        items = [p if isinstance(p, tuple) else (None, p) for p in params]
    _agree_with_root(items, root_rank, process_set)
    handles = []
    for name, p in items:
        handles.append(core.broadcast_async_(to_numpy(p), root_rank,
                                             name=None if name is None else f"broadcast.{name}",
                                             process_set=process_set))
    for h in handles:
        wait(h)


def _describe(items):
    return [(name, tuple(p.shape), str(p.dtype)) if isinstance(p, torch.Tensor) else (name, None, type(p).__name__)
            for name, p in items]


def _agree_with_root(items, root_rank, process_set):
    mine = _describe(items)
    everyone = objects.allgather_object(mine, process_set=process_set)
    ranks = list(range(basics.size())) if process_set is None or process_set.process_set_id == 0 else process_set.ranks
    if root_rank not in ranks:
        raise InvalidArgumentError(f"broadcast_parameters: root rank {root_rank!r} is not one of the ranks {ranks}")
    problems = []
    for rank, desc in zip(ranks, everyone):
        bad = [f"{name!r} is a {kind}, not a tensor" for name, shape, kind in desc if shape is None]
        if bad:
            problems.append(f"rank {rank}: " + "; ".join(bad))
    root = everyone[ranks.index(root_rank)]
    for rank, desc in zip(ranks, everyone):
        if rank == root_rank or desc == root:
            continue
        if any(name is None for name, _, _ in desc + root):
            problems.append(f"rank {rank} has {len(desc)} tensors of shapes {[d[1] for d in desc]}, root rank "
                            f"{root_rank} {len(root)} of shapes {[d[1] for d in root]}")
            continue
        theirs, roots = {d[0]: d[1:] for d in desc}, {d[0]: d[1:] for d in root}
        parts = []
        missing = sorted(set(roots) - set(theirs))
        extra = sorted(set(theirs) - set(roots))
        if missing:
            parts.append(f"lacks {missing}")
        if extra:
            parts.append(f"has extra {extra}")
        for name in sorted(set(theirs) & set(roots)):
            if theirs[name] != roots[name]:
                parts.append(f"{name!r} is {theirs[name][0]} {theirs[name][1]} there, {roots[name][0]} "
                             f"{roots[name][1]} on the root")
        problems.append(f"rank {rank} " + ", ".join(parts))
    if problems:
        raise InvalidArgumentError(f"broadcast_parameters from root rank {root_rank}: the ranks hold different "
                                   "parameters: " + "; ".join(problems))


# ---------------------------------------------------------------- state initialization

def _sparse_parameters(model):
    """The parameters of ``model`` whose gradients are sparse (embeddings with sparse=True)."""
    if model is None:
        return set()
    if not isinstance(model, torch.nn.Module):
        raise InvalidArgumentError(
            f"broadcast_optimizer_state: model must be a torch.nn.Module, not {type(model).__name__}")
    found = set()
    for module in model.modules():
        if isinstance(module, (torch.nn.Embedding, torch.nn.EmbeddingBag)) and module.sparse:
            found.update(module.parameters(recurse=False))
    return found


def _base_step(optimizer):
    """The wrapped optimizer's own step: a DistributedOptimizer's would synchronize gradients,
    a collective call the other ranks are not making."""
    local_step = getattr(optimizer, "_local_step", None)  # a DistributedOptimizer's, see optimizer.py
    return local_step() if local_step is not None else optimizer.step()


def _initialize_state(optimizer, sparse):
    """Give a fresh optimizer its state (Horovod's zero-gradient step), leaving the parameters
    as they were. ``sparse``: the parameters whose zero gradients are sparse."""
    all_sparse = isinstance(optimizer, torch.optim.SparseAdam)
    params = [p for group in optimizer.param_groups for p in group["params"] if p.requires_grad]
    saved = [p.detach().clone() for p in params]
    for p in params:
        zero = torch.zeros_like(p, memory_format=torch.contiguous_format)
        p.grad = zero.to_sparse() if all_sparse or p in sparse else zero
    _base_step(optimizer)
    with torch.no_grad():
        for p, before in zip(params, saved):
            p.copy_(before)


# ---------------------------------------------------------------- optimizer state

def _describe_state(state):
    """Root's optimizer state with tensors replaced by (shape, dtype, device, sparse dims)
    placeholders. Sparse state (SGD's momentum for sparse gradients) travels in dense form."""
    out = {}
    for pid, entries in state.items():
        desc = {}
        for key, value in entries.items():
            if isinstance(value, torch.Tensor):
                sparse_dim = value.sparse_dim() if value.is_sparse else None
                desc[key] = ("tensor", tuple(value.shape), str(value.dtype).replace("torch.", ""), value.device.type,
                             sparse_dim)
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


def broadcast_optimizer_state(optimizer, root_rank, model=None, process_set=None):
    """Make every rank's optimizer state and hyperparameters equal to ``root_rank``'s.

    ``model`` (optional, as in Horovod) identifies the parameters of sparse embeddings, whose
    zero gradients must be sparse when a fresh optimizer's state is initialized (see the
    module docstring). The state's structure, scalars and ``param_groups`` go as one pickled
    object; the state tensors are then broadcast in place (reusing a rank's own tensors where
    shape and dtype agree, allocating where the rank has not stepped yet), and loaded with
    ``load_state_dict`` on the other ranks.
    """
    check_process_set(process_set)
    if hasattr(optimizer, "broadcast_state_from"):  # sharded (zero_optimizer.py): its own collective
        return optimizer.broadcast_state_from(root_rank)
    if isinstance(optimizer, torch.optim.LBFGS):
        raise ValueError("cannot broadcast torch.optim.LBFGS state")
    sparse = _sparse_parameters(model)
    if len(optimizer.state_dict()["state"]) == 0:
        _initialize_state(optimizer, sparse)
    state_dict = optimizer.state_dict()
    if len(state_dict["state"]) == 0:
        # Still no state: a stateless optimizer (SGD without momentum). Horovod returns here
        # without broadcasting anything, so each rank keeps its own param_groups (its own lr);
        # so do we, for the same results and the same collective calls.
        return
    is_root = basics.rank() == root_rank
    desc = None
    if is_root:
        groups = [{k: v for k, v in g.items()} for g in state_dict["param_groups"]]
        desc = {"param_groups": groups, "state": _describe_state(state_dict["state"])}
    desc = objects.broadcast_object(desc, root_rank, name="broadcast_optimizer_state.structure",
                                    process_set=process_set)

    local = state_dict["state"]
    params = [p for group in optimizer.param_groups for p in group["params"]]  # state_dict's ids index these
    new_state, handles, sparse_back = {}, [], []
    for pid in sorted(desc["state"], key=str):
        entries = {}
        for key in sorted(desc["state"][pid], key=str):
            kind, *rest = desc["state"][pid][key]
            if kind == "value":
                entries[key] = rest[0]
                continue
            shape, dtype_name, device_type, sparse_dim = rest
            dtype = getattr(torch, dtype_name)
            device = _state_device(device_type, params, pid)
            tensor = local.get(pid, {}).get(key)
            if is_root:  # sends its own tensor (a sparse one in dense form; the root keeps the sparse one)
                tensor = tensor.to_dense() if sparse_dim is not None else tensor
            elif not (isinstance(tensor, torch.Tensor) and not tensor.is_sparse and tuple(tensor.shape) == shape
                      and tensor.dtype == dtype and tensor.is_contiguous() and tensor.device.type == device.type):
                tensor = torch.empty(shape, dtype=dtype, device=device)
            if not is_root:
                entries[key] = tensor
                if sparse_dim is not None:
                    sparse_back.append((entries, key, sparse_dim))
            handles.append(core.broadcast_async_(to_numpy(tensor), root_rank,
                                                 name=f"broadcast_optimizer_state.{pid}.{key}",
                                                 process_set=process_set))
        new_state[pid] = entries
    for h in handles:
        wait(h)
    for entries, key, sparse_dim in sparse_back:
        entries[key] = entries[key].to_sparse(sparse_dim)
    if not is_root:
        optimizer.load_state_dict({"state": new_state, "param_groups": desc["param_groups"]})
