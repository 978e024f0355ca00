"""Horovod's ``DistributedOptimizer(op=hvd.Adasum)`` for torch: the delta optimizer.

Adasum combines what each rank's optimizer would do to the model, not the gradients: as
soon as a parameter's gradient is final (after ``backward_passes_per_step`` backward passes),
the wrapped optimizer steps that parameter alone on this rank's gradient, the change it made
(delta = new - start) replaces the parameter's data and is allreduced in place with
op=Adasum, and ``step()`` sets every parameter to start + the combined delta. The optimizer's
state (momentum, Adam's moments) stays local to each rank, as in Horovod.

Used for more than one rank in the job (with one, ``DistributedOptimizer`` is the plain
optimizer, as in Horovod), and only with the global process set. ``synchronize()`` does
nothing and ``skip_synchronize()`` raises, as in Horovod. Unlike Horovod, a parameter whose
delta cannot be submitted (a non-power-of-two number of ranks) gets its value back before the
error propagates from the backward pass, and unnamed parameters are numbered across all
parameter groups (Horovod numbers them per group, so two groups collide).

Calls go downward only: this module uses the core (``collectives.ops``).
"""
import contextlib

import torch

from collectives import ops as core
from collectives.constants import Adasum
from collectives.process_set_registry import process_set_id

from .compression import Compression
from .grad_hooks import register_grad_ready_hooks, remove_hooks
from .tensors import to_numpy
from .tensors import wait  # internal handles: waited on without releasing them

__all__ = ["distributed_adasum_optimizer"]


def _parameter_names(named_parameters, all_params):
    """{param: name}, with Horovod's checks of ``named_parameters``."""
    if named_parameters is None:
        return {p: f"noname.{i}" for i, p in enumerate(all_params)}
    named_parameters = list(named_parameters)
    if any(not isinstance(p, tuple) for p in named_parameters):
        raise ValueError("named_parameters should be a sequence of tuples (name, parameter), usually "
                         "produced by model.named_parameters()")
    names = [n for n, _ in named_parameters]
    dups = sorted({n for n in names if names.count(n) > 1})
    if dups:
        raise ValueError(f"Parameter names in named_parameters must be unique. Found duplicates: {dups}")
    by_param = {p: n for n, p in named_parameters}
    unnamed = [p for p in all_params if p not in by_param]
    if unnamed:
        raise ValueError("named_parameters was specified, but one or more model parameters were not "
                         "named. Python object ids: " + ", ".join(str(id(p)) for p in unnamed))
    return by_param


class _DistributedAdasumOptimizer:
    """Mixin placed before the wrapped optimizer's class in a dynamic subclass."""

    def _adasum_init(self, named_parameters, compression, backward_passes_per_step):
        if backward_passes_per_step < 1:
            raise ValueError("backward_passes_per_step must be >= 1")
        self._compression = compression if compression is not None else Compression.none
        self.backward_passes_per_step = int(backward_passes_per_step)
        all_params = [p for group in self.param_groups for p in group["params"]]
        self._parameter_names = _parameter_names(named_parameters, all_params)
        self._requires_update = [p for p in all_params if p.requires_grad]
        self._allreduce_delay = {p: self.backward_passes_per_step for p in self._requires_update}
        # param -> (handle, compressed delta, ctx), or None while its passes are accumulating
        self._handles = {}
        # Each parameter's value before its last local step (the delta's origin).
        self._starting_models = {p: torch.zeros_like(p, requires_grad=False) for p in self._requires_update}
        self._hook_handles = []
        self._register_hooks()

    def _register_hooks(self):
        for p in self._requires_update:
            if p.grad is None:  # as Horovod: a gradient to step on even if backward never reaches p
                p.grad = torch.zeros_like(p)
        self._hook_handles += register_grad_ready_hooks(self, self._requires_update)

    def _remove_hooks(self):
        remove_hooks(self._hook_handles)
        self._hook_handles = []

    def set_backward_passes_per_step(self, passes):
        self.backward_passes_per_step = passes
        for p in self._allreduce_delay:
            self._allreduce_delay[p] = passes

    def _on_grad_ready(self, p):
        if self._allreduce_delay[p] <= 0:
            raise AssertionError(
                "Gradients were computed more than backward_passes_per_step times before call to step(). "
                "Increase backward_passes_per_step to accumulate gradients locally.")
        self._allreduce_delay[p] -= 1
        self._handles[p] = self._submit_delta(p) if self._allreduce_delay[p] == 0 else None

    def _submit_delta(self, p):
        """Step ``p`` alone with the wrapped optimizer, turn its data into the step's delta and
        start the delta's Adasum allreduce (in place)."""
        start = self._starting_models[p]
        stashed = [group["params"] for group in self.param_groups]
        for group in self.param_groups:
            group["params"] = [p] if any(p is v for v in group["params"]) else []
        try:
            with torch.no_grad():
                start.copy_(p)
            super().step()
        finally:
            for group, params in zip(self.param_groups, stashed):
                group["params"] = params
        p.data.sub_(start)  # the delta, in the parameter's own memory (as Horovod)
        compressed, ctx = self._compression.compress(p.data)
        try:
            handle = core.allreduce_async_(to_numpy(compressed), op=Adasum, name="allreduce." + self._parameter_names[p])
        except BaseException:
            p.data.copy_(start)  # the parameter, not a delta, is what the caller is left with
            raise
        return handle, compressed, ctx

    def synchronize(self):
        """Nothing to do: Adasum combines the optimizer's steps, in ``step()`` (as Horovod)."""

    @contextlib.contextmanager
    def skip_synchronize(self):
        raise AssertionError("Skipping synchronization is not supported when using Adasum optimizer.")
        yield  # pragma: no cover - makes this a generator for contextmanager

    def step(self, closure=None):
        loss = closure() if closure is not None else None
        for p in self._requires_update:  # parameters whose passes did not all complete: step them now
            if self._handles.get(p) is None:
                self._handles[p] = self._submit_delta(p)
        try:
            for p, (handle, compressed, ctx) in self._handles.items():
                wait(handle)
                delta = self._compression.decompress(compressed, ctx)
                start = self._starting_models[p]
                with torch.no_grad():
                    start.add_(delta)
                p.data.copy_(start)
        finally:
            self._handles.clear()
            for p in self._requires_update:
                self._allreduce_delay[p] = self.backward_passes_per_step
        return loss

    def _local_step(self):
        """The wrapped optimizer's own step on every parameter, without communication
        (broadcast_optimizer_state gives a fresh optimizer its state with it)."""
        return super().step()

    def zero_grad(self, *args, **kwargs):
        if self._handles:
            raise AssertionError("optimizer.zero_grad() was called after loss.backward() but before "
                                 "optimizer.step() or optimizer.synchronize(). This is prohibited as it can "
                                 "cause a race condition.")
        return super().zero_grad(*args, **kwargs)


def distributed_adasum_optimizer(optimizer, named_parameters, compression, backward_passes_per_step, process_set):
    """The delta optimizer wrapping ``optimizer`` (a dynamic subclass of its class sharing its
    parameter groups, state and hyperparameters). Global process set only, as in Horovod."""
    if process_set_id(process_set) != 0:
        raise NotImplementedError("Adasum does not support non-global process sets yet.")
    base = optimizer.__class__
    cls = type(base.__name__, (_DistributedAdasumOptimizer, base), {"__module__": __name__})
    dist = cls.__new__(cls)
    dist.__dict__.update(optimizer.__dict__)
    dist._adasum_init(named_parameters, compression, backward_passes_per_step)
    return dist
