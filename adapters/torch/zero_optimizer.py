"""``DistributedOptimizer(..., zero_stage=1 or 2)``: optimizer state (and, at stage 2, gradients)
sharded over the ranks of the process set, after ZeRO (Rajbhandari et al., arXiv 1910.02054).

The parameters are laid out in flat buckets (zero_buckets.py); each rank owns a contiguous, equal
slice of every bucket. The user's optimizer class steps a flat tensor per bucket slice (the
"shard"), in one param group per original group, so its state exists only for the shard and the
groups keep their own hyperparameters (synced from the wrapper's groups before every step, so LR
schedulers work). A step:

1. backward: when the last gradient of a bucket is final (after ``backward_passes_per_step``
   passes), the hook copies the bucket's gradients into one flat, reused buffer
   (zero_grad_buffers.py) and starts its reducescatter; at stage 1 the parameters' ``.grad`` then
   are views of the buffer, at stage 2 they are released there. ``synchronize()``
   starts the buckets whose hooks did not all fire (missing gradients count as zeros, on every
   rank alike) and waits: each shard's ``.grad`` is then its slice of the reduced gradient.
2. ``step()``: the shards are refreshed from the parameters (a 1/N copy: the parameters stay the
   truth, so loading or broadcasting them between steps just works), the inner optimizer steps
   the shards, and each bucket's updated shard is allgathered back into the parameters.

Between steps ``p.grad`` holds this rank's local, unreduced gradient at stage 1 (as after
``backward()``), and None at stage 2; the reduced gradient exists only as the shards' ``.grad``
until the step, which releases them. The shards' state is reached through the checkpoint methods
(zero_checkpoint.py), not through ``optimizer.state``, which stays empty.

Calls go downward only: this module uses the core (``collectives.ops`` through ``.ops``).
"""
import contextlib
import math
import os
from collections import defaultdict

import torch

from collectives import objects
from collectives.constants import Average, Max, Sum
from collectives.errors import NotSupportedError
from collectives.process_set_registry import process_set_id, set_rank, set_size
from collectives.zero_agreement import agree

from . import ops as raw
from . import zero_amp, zero_checkpoint
from .adasum_optimizer import _parameter_names
from .compression import Compression
from .grad_hooks import register_grad_ready_hooks, remove_hooks, synchronize_before_step
from .tensors import wait
from .zero_buckets import build_buckets, signature
from .zero_checks import check_arguments
from .zero_grad_buffers import grad_buffers

__all__ = ["zero_optimizer"]


class _ZeroOptimizer:
    """Mixin placed before the wrapped optimizer's class in a dynamic subclass."""

    # torch.amp.GradScaler then checks nothing itself and passes itself to step() (its
    # grad_scaler keyword), which unscales and checks the reduced shards and agrees on skipping
    # over the ranks (zero_amp.py).
    _step_supports_amp_scaling = True

    # -- setup

    def _zero_setup(self, optimizer, stage, named_parameters, compression, backward_passes_per_step, op,
                    gradient_predivide_factor, sparse_as_dense, process_set):
        self.zero_stage = stage
        self._compression = compression if compression is not None else Compression.none
        self.backward_passes_per_step = int(backward_passes_per_step)
        self.op = op
        self.gradient_predivide_factor = float(gradient_predivide_factor)
        self.sparse_as_dense = sparse_as_dense
        self.process_set = process_set
        member = process_set_id(process_set) == 0 or bool(process_set.included())
        self._communicates = member and set_size(process_set) > 1
        self._ranks, self._rank = (set_size(process_set), set_rank(process_set)) if self._communicates else (1, 0)
        self.state = defaultdict(dict)  # the shards' state lives in the inner optimizer
        full = [list(g["params"]) for g in self.param_groups]
        all_params = [p for g in full for p in g]
        self._parameter_names = _parameter_names(named_parameters, all_params)
        self._buckets = build_buckets(full, self._ranks, self._rank)
        self._signature = signature(self._buckets, full)
        self._shards = [torch.zeros(b.shard_length, dtype=b.dtype, device=b.device) for b in self._buckets]
        self._shard_bucket = {id(s): b for b, s in enumerate(self._shards)}
        self._pieces = [list(b.pieces()) for b in self._buckets]
        self._bucket_of = {slot.param: b for b, bucket in enumerate(self._buckets) for slot in bucket.slots}
        self._requires_update = list(self._bucket_of)
        inner_groups = [dict({k: v for k, v in g.items() if k not in ("params", "param_names")},
                             params=[s for s, b in zip(self._shards, self._buckets) if b.group == i])
                        for i, g in enumerate(self.param_groups)]
        carried = optimizer.state_dict() if optimizer.state else None  # a loaded checkpoint; Adagrad's sums
        # The user's optimizer object itself steps the shards (its class, hooks and settings);
        # this wrapper keeps the full param groups it was built with.
        optimizer.param_groups = inner_groups
        optimizer.state = defaultdict(dict)
        self._inner = optimizer
        inner_order = [id(s) for g in self._inner.param_groups for s in g["params"]]
        self._inner_index = {self._shard_bucket[i]: n for n, i in enumerate(inner_order)}
        self._delay = {p: self.backward_passes_per_step for p in self._requires_update}
        self._arrived = [0] * len(self._buckets)
        self._pending = {}   # bucket -> (handle, ctx) of its reducescatter, in the order started; None once waited
        self._grad_buffers = grad_buffers(stage, self._buckets)
        self._synchronized = False
        self._should_synchronize = True
        self._consolidated = None
        self._hook_handles = []
        if carried is not None:
            zero_checkpoint.load_full(self, carried)

    def _start(self):
        if self._communicates:
            self._hook_handles += register_grad_ready_hooks(self, self._requires_update)

    def _remove_hooks(self):
        remove_hooks(self._hook_handles)
        self._hook_handles = []

    # -- gradients

    def _name(self, what, b):
        first = self._buckets[b].slots[0].param
        return f"zero{self.zero_stage}.{what}.{b}.{self._parameter_names[first]}"

    def _flat_grad(self, b):
        """The bucket's gradients in one flat tensor (zeros where a parameter has none, and in the
        padding): a reused buffer (zero_grad_buffers.py) when it is reducescattered; at stage 1 each
        ``p.grad`` then is a view of it, at stage 2 the parameters' gradients are released."""
        bucket = self._buckets[b]
        if self._communicates:
            flat = self._grad_buffers.take(b, self._finish_oldest)
            as_views = self._grad_buffers.views_as_grads
        else:  # it becomes the shard's .grad itself, which unscaling and clipping change in place
            flat = torch.empty(bucket.length, dtype=bucket.dtype, device=bucket.device)
            as_views = False
        for slot in bucket.slots:
            g = slot.param.grad
            target = flat[slot.offset:slot.offset + slot.numel]
            if g is None:
                target.zero_()
            elif g.is_sparse:
                if not self.sparse_as_dense:
                    raise NotSupportedError(
                        f"zero_stage={self.zero_stage}: parameter {self._parameter_names[slot.param]} got a "
                        f"sparse gradient; sharding needs dense ones: pass sparse_as_dense=True")
                target.copy_(g.to_dense().reshape(-1))
            elif g.data_ptr() != target.data_ptr() or not g.is_contiguous():
                target.copy_(g.reshape(-1))
                if as_views:  # the next backward accumulates into the buffer
                    slot.param.grad = target.view(slot.param.shape)
            if self.zero_stage == 2:
                slot.param.grad = None
        end = bucket.slots[-1].offset + bucket.slots[-1].numel
        flat[end:].zero_()
        return flat

    def _scale_args(self):
        if self.op == Average and self.gradient_predivide_factor != 1.0:
            f = self.gradient_predivide_factor
            return Sum, 1.0 / f, f / self._ranks
        return self.op, 1.0, 1.0

    def _reduce_async(self, b):
        try:
            compressed, ctx = self._compression.compress(self._flat_grad(b))
            op, pre, post = self._scale_args()
            handle = raw.reducescatter_async(compressed, op, self._name("reducescatter", b), pre, post,
                                             self.process_set)
        except BaseException:
            self._grad_buffers.discard(b)
            raise
        return handle, ctx

    def _finish(self, b):
        """Wait for bucket ``b``'s reducescatter: its shard's ``.grad``; its buffer is free again.
        The bucket stays in ``_pending`` (started this step), as done."""
        handle, ctx = self._pending[b]
        self._pending[b] = None
        try:
            reduced = wait(handle)
        finally:
            self._grad_buffers.release(b)
        self._shards[b].grad = self._compression.decompress(reduced, ctx).to(self._shards[b].dtype)

    def _finish_oldest(self):
        """Stage 2's pool is in use: free the buffer of the reducescatter started first."""
        self._finish(next(b for b, running in self._pending.items() if running is not None))

    def _on_grad_ready(self, p):
        self._synchronized = False
        if self._delay[p] <= 0:
            raise AssertionError(
                "Gradients were computed more than backward_passes_per_step times before call to step(). "
                "Increase backward_passes_per_step to accumulate gradients locally.")
        self._delay[p] -= 1
        if self._delay[p] > 0:
            return
        b = self._bucket_of[p]
        self._arrived[b] += 1
        if self._arrived[b] == len(self._buckets[b].slots):
            self._pending[b] = self._reduce_async(b)

    def synchronize(self):
        """Finish every bucket's reducescatter: each shard's ``.grad`` is then this rank's slice of
        the reduced gradients. Buckets whose gradients were not all final are reduced now (a
        missing gradient counts as zeros). Without new gradients since the last call, nothing."""
        if self._synchronized:
            return
        try:
            for b, shard in enumerate(self._shards):
                if not self._communicates:
                    shard.grad = self._flat_grad(b)
                elif b not in self._pending:
                    self._pending[b] = self._reduce_async(b)
            for b in sorted(self._pending):
                if self._pending[b] is not None:
                    self._finish(b)
        finally:
            for b, running in self._pending.items():  # after an error: may still run on its buffer
                if running is not None:
                    self._grad_buffers.discard(b)
            self._pending.clear()
            self._arrived = [0] * len(self._buckets)
            for p in self._requires_update:
                self._delay[p] = self.backward_passes_per_step
        self._synchronized = True

    @contextlib.contextmanager
    def skip_synchronize(self):
        """``step()`` inside this block does not synchronize (call ``synchronize()`` or
        ``clip_grad_norm_()`` first)."""
        self._should_synchronize = False
        try:
            yield
        finally:
            self._should_synchronize = True

    def clip_grad_norm_(self, max_norm, norm_type=2.0, error_if_nonfinite=False):
        """Clip the reduced gradients by their global norm over every shard (one allreduce of one
        number), as ``torch.nn.utils.clip_grad_norm_`` clips whole gradients; returns the total
        norm. Synchronizes first if needed: then step inside ``skip_synchronize()``."""
        self.synchronize()
        grads = [s.grad for s in self._shards if s.grad is not None]
        norm_type = float(norm_type)
        if math.isinf(norm_type):
            local = max((g.detach().abs().max().float() for g in grads), default=torch.tensor(0.0))
            op = Max
        else:
            local = sum((torch.linalg.vector_norm(g.detach(), norm_type, dtype=torch.float32) ** norm_type
                         for g in grads), torch.tensor(0.0))
            op = Sum
        local = local.reshape(1).to(torch.float32)
        total = raw.allreduce(local, op, "zero_optimizer.clip_grad_norm", process_set=self.process_set) \
            if self._communicates else local
        total = total[0] if math.isinf(norm_type) else total[0] ** (1.0 / norm_type)
        if error_if_nonfinite and not torch.isfinite(total):
            raise RuntimeError(f"The total norm of order {norm_type} for gradients from `parameters` is non-finite, "
                               "so it cannot be clipped. To disable this error and scale the gradients by the "
                               "non-finite norm anyway, set `error_if_nonfinite=False`")
        coef = torch.clamp(max_norm / (total + 1e-6), max=1.0)
        for g in grads:
            g.mul_(coef.to(g.dtype))
        return total

    # -- step

    def _sync_hyperparameters(self):
        for outer, inner in zip(self.param_groups, self._inner.param_groups):
            for key, value in outer.items():
                if key not in ("params", "param_names"):
                    inner[key] = value

    @torch.no_grad()
    def _read_shards(self):
        for shard, pieces in zip(self._shards, self._pieces):
            for slot, src, dst, n in pieces:
                shard[dst:dst + n].copy_(slot.param.detach().reshape(-1)[src:src + n])

    @torch.no_grad()
    def _write_params(self):
        """Every bucket's updated shards, allgathered back into the parameters."""
        if self._communicates:
            handles = [raw.allgather_async(s, self._name("allgather", b), self.process_set)
                       for b, s in enumerate(self._shards)]
            fulls = (wait(h) for h in handles)
        else:
            fulls = iter(self._shards)
        for bucket, full in zip(self._buckets, fulls):
            for slot in bucket.slots:
                slot.param.copy_(full[slot.offset:slot.offset + slot.numel].view(slot.param.shape))

    def step(self, closure=None, grad_scaler=None):
        """``grad_scaler``: passed by ``torch.amp.GradScaler.step(optimizer)`` (zero_amp.py); the
        reduced shards are unscaled, and the step is skipped on every rank if any has inf/NaN."""
        if getattr(self, "grad_scale", None) is not None or getattr(self, "found_inf", None) is not None:
            raise NotSupportedError(f"zero_stage={self.zero_stage}: this GradScaler hands the optimizer a found_inf "
                                    "flag from the local, unreduced p.grad instead of passing itself (grad_scaler=); "
                                    "the sharded optimizer needs the latter (torch 2.13's protocol)")
        if grad_scaler is not None:
            zero_amp.refuse_unscaled(self, grad_scaler)
        loss = None
        if closure is not None:  # its backward's gradients are the ones this step reduces
            with torch.enable_grad():
                loss = closure()
        synchronize_before_step(self)
        self._consolidated = None
        if grad_scaler is not None and zero_amp.unscale_shards(self, grad_scaler):
            for shard in self._shards:  # inf/NaN on some rank: no rank steps
                shard.grad = None
            self._synchronized = False
            return loss
        self._sync_hyperparameters()
        self._read_shards()
        self._inner.step()
        self._write_params()
        for shard in self._shards:
            shard.grad = None
        self._synchronized = False
        return loss

    def zero_grad(self, *args, **kwargs):
        if self._pending:
            raise AssertionError("optimizer.zero_grad() was called after loss.backward() but before "
                                 "optimizer.step() or optimizer.synchronize(). This is prohibited as it can "
                                 "cause a race condition.")
        return super().zero_grad(*args, **kwargs)

    def add_param_group(self, param_group):
        raise NotSupportedError("a zero_stage optimizer's parameters are fixed at construction (they are laid out "
                                "in buckets agreed by every rank); build a new optimizer instead")

    # -- checkpoints (zero_checkpoint.py)

    def shard_state_numel(self):
        """Elements of this rank's elementwise optimizer state (for memory accounting)."""
        return sum(v.numel() for s in self._shards for v in self._inner.state.get(s, {}).values()
                   if isinstance(v, torch.Tensor) and v.shape == s.shape)

    def consolidate_state_dict(self, to=0):
        """Collective: gather the whole state on rank ``to`` of the process set, where ``state_dict()``
        then returns it in the unwrapped optimizer's format."""
        self._consolidated = zero_checkpoint.consolidate(self, to)

    def state_dict(self):
        if not self._communicates:
            return zero_checkpoint.consolidate(self, 0)
        if self._consolidated is None:
            raise RuntimeError(
                f"zero_stage={self.zero_stage}: the optimizer state is sharded over {self._ranks} ranks and was not "
                f"consolidated on this rank since the last step: call optimizer.consolidate_state_dict(to=R) on "
                f"every rank, then state_dict() on rank R (or sharded_state_dict() on every rank)")
        return self._consolidated

    def broadcast_state_from(self, root_rank):
        """``broadcast_optimizer_state(optimizer, root_rank)``: the root's hyperparameters (its
        ``param_groups``) on every rank. The state stays as it is: each rank holds only its own
        slices, so the root has none of the others' to send; load a checkpoint on every rank
        instead (``load_state_dict`` of the whole dict, or ``load_sharded_state_dict``)."""
        if not self._communicates:
            return
        groups = [{k: v for k, v in g.items() if k not in ("params", "param_names")} for g in self.param_groups]
        groups = objects.broadcast_object(groups, root_rank, name="zero_optimizer.broadcast_state",
                                          process_set=self.process_set)
        for group, theirs in zip(self.param_groups, groups):
            group.update(theirs)

    def load_state_dict(self, state_dict):
        """Load an unwrapped optimizer's state dict (every rank passes the whole dict; each keeps
        its slices)."""
        zero_checkpoint.load_full(self, state_dict)

    def sharded_state_dict(self):
        """This rank's slices of the state and the layout, for ``load_sharded_state_dict`` at any
        number of ranks."""
        return zero_checkpoint.sharded(self)

    def save_sharded_state_dict(self, directory):
        """Write this rank's ``sharded_state_dict()`` to ``directory`` (one file per rank)."""
        os.makedirs(directory, exist_ok=True)
        path = zero_checkpoint.shard_file(directory, self._rank, self._ranks)
        torch.save(self.sharded_state_dict(), path)
        return path

    def load_own_sharded_state_dict(self, saved):
        """Load this rank's own ``sharded_state_dict()`` back (same ranks; not collective)."""
        zero_checkpoint.load_own(self, saved)

    def gather_sharded_state_dicts(self, mine=None):
        """Collective: every rank's ``sharded_state_dict()`` (or ``mine``), in rank order, on every rank."""
        mine = self.sharded_state_dict() if mine is None else mine
        if not self._communicates:
            return [mine]
        return objects.allgather_object(mine, name="zero_optimizer.gather_shards", process_set=self.process_set)

    def load_sharded_state_dict(self, shards):
        """Load every rank's sharded state dicts (a list, or the directory ``save_sharded_state_dict``
        wrote), saved at any number of ranks."""
        if isinstance(shards, (str, os.PathLike)):
            shards = zero_checkpoint.read_shards(shards)
        zero_checkpoint.load_full(self, zero_checkpoint.full_from_shards(list(shards)))


def zero_optimizer(optimizer, zero_stage, named_parameters=None, compression=None, backward_passes_per_step=1,
                   op=Average, gradient_predivide_factor=1.0, num_groups=0, groups=None, sparse_as_dense=False,
                   process_set=None):
    """The sharded ``DistributedOptimizer`` (module docstring). Collective: every rank of the set
    constructs it, and a refusal or a parameter list that differs raises on every rank."""
    process_set_id(process_set)  # an unregistered set raises now, on every rank alike
    base = optimizer.__class__
    cls = type(base.__name__, (_ZeroOptimizer, base), {"__module__": __name__})
    dist = cls.__new__(cls)
    dist.__dict__.update(optimizer.__dict__)  # param_groups (the full parameters), defaults, hooks
    problem = sig = None
    try:
        check_arguments(optimizer, zero_stage, op, gradient_predivide_factor, backward_passes_per_step, num_groups,
                        groups)
        dist._zero_setup(optimizer, zero_stage, named_parameters, compression, backward_passes_per_step, op,
                         gradient_predivide_factor, sparse_as_dense, process_set)
        sig = dist._signature
    except Exception as e:  # noqa: BLE001 - shared with the other ranks before it is raised
        problem = e
    member = process_set_id(process_set) == 0 or bool(process_set.included())
    if member and set_size(process_set) > 1:
        agree(problem, sig, process_set, zero_stage)
    elif problem is not None:
        raise problem
    dist._start()
    return dist
