"""Horovod's ``TorchState``: models, optimizers and ElasticSamplers tracked by handlers, other
keyword arguments as ObjectState attributes.

A commit copies each tracked object's state in memory (tensors cloned, as Horovod's deep copy
of the state_dicts does); under the elastic driver the commit file is written from those copies
in the background, its tensors as numpy views of them (no second copy). Restoring from a file
turns them back into tensors.
"""
import copy

import numpy as np
import torch

from collectives.basics import rank
from collectives.elastic.state import ObjectState

from .broadcasts import broadcast_optimizer_state, broadcast_parameters
from .elastic_sampler import ElasticSampler
from .mpi_ops import allgather_object, broadcast_object
from .zero_optimizer import _ZeroOptimizer


_NUMPY_DTYPES = {torch.float16, torch.float32, torch.float64, torch.uint8, torch.int8, torch.int16, torch.int32,
                 torch.int64, torch.bool}


def _map(fn, value):
    """``fn`` applied to every leaf of nested dicts, lists and tuples (a state_dict's
    ``_metadata``, which load_state_dict reads, is kept)."""
    if isinstance(value, dict):
        out = type(value)((k, _map(fn, v)) for k, v in value.items())
        if hasattr(value, "_metadata"):
            out._metadata = copy.deepcopy(value._metadata)
        return out
    if isinstance(value, tuple) and hasattr(value, "_fields"):  # a namedtuple
        return type(value)(*(_map(fn, v) for v in value))
    if isinstance(value, (list, tuple)):
        return type(value)(_map(fn, v) for v in value)
    return fn(value)


def _copy_leaf(value):
    """The in-memory commit: tensors as detached clones, anything else deep-copied."""
    if isinstance(value, torch.Tensor):
        return value.detach().clone()
    return copy.deepcopy(value)


def _portable_leaf(value):
    """Tensors as numpy arrays (written as out-of-band pickle buffers): CPU ones share the
    commit's memory, GPU ones are copied to the host here (a restore loads them back to the
    parameters' devices). Tensors numpy cannot hold (bfloat16, sparse) stay tensors and pickle
    as torch does."""
    if isinstance(value, torch.Tensor) and value.layout == torch.strided and value.dtype in _NUMPY_DTYPES:
        return value.detach().cpu().numpy()
    return value


def _from_portable_leaf(value):
    return torch.from_numpy(value) if isinstance(value, np.ndarray) else value


def _copy(value):
    return _map(_copy_leaf, value)


def _to_portable(value):
    return _map(_portable_leaf, value)


def _from_portable(value):
    return _map(_from_portable_leaf, value)


class StateHandler:
    """Commits, restores and syncs one tracked object."""

    def __init__(self, value):
        self.value = value
        self.saved = None
        self.save()

    def save(self):
        self.saved = _copy(self.value.state_dict())

    def restore(self):
        self.value.load_state_dict(self.saved)

    def sync(self):
        raise NotImplementedError()

    def set_value(self, value):
        self.value = value
        self.save()

    def portable(self):
        return _to_portable(self.saved)

    def load_portable(self, obj):
        self.saved = _from_portable(obj)
        self.restore()


class ModelStateHandler(StateHandler):
    def sync(self):
        broadcast_parameters(self.value.state_dict(), root_rank=0)


class OptimizerStateHandler(StateHandler):
    def sync(self):
        broadcast_optimizer_state(self.value, root_rank=0)


class ShardedOptimizerStateHandler(StateHandler):
    """A ``zero_stage`` optimizer: each rank commits in memory only its own slices of the state
    (``sharded_state_dict()``, 1/N of it). A commit file must restart the job from any one rank's
    file at any size, so it holds every rank's slices: gathered (one allgather) when the commit is
    handed to the writer, and loaded at the new size by ``load_sharded_state_dict``, which
    redistributes the slices over the new ranks."""

    def save(self):
        self.saved = self.value.sharded_state_dict()

    def restore(self):
        self.value.load_own_sharded_state_dict(self.saved)

    def sync(self):
        broadcast_optimizer_state(self.value, root_rank=0)

    def portable(self):
        everyone = self.value.gather_sharded_state_dicts(self.saved)
        return {"zero_shards": [_to_portable(s) for s in everyone]}

    def load_portable(self, obj):
        if isinstance(obj, dict) and "zero_shards" in obj:
            self.value.load_sharded_state_dict([_from_portable(s) for s in obj["zero_shards"]])
        else:  # committed by an unsharded optimizer (the same model): its whole state dict
            self.value.load_state_dict(_from_portable(obj))
        self.save()


class SamplerStateHandler(StateHandler):
    def sync(self):
        # Samples recorded on any rank count as processed; epoch and all come from rank 0.
        processed = set().union(*allgather_object(self.value.processed_indices))
        state_dict = self.value.state_dict()
        state_dict["processed_indices"] = processed
        self.value.load_state_dict(broadcast_object(state_dict))

    def portable(self):
        return self.saved  # small Python objects: pickled as they are


_handler_registry = [
    (torch.nn.Module, ModelStateHandler),
    (_ZeroOptimizer, ShardedOptimizerStateHandler),  # before its base class, torch's Optimizer
    (torch.optim.Optimizer, OptimizerStateHandler),
    (ElasticSampler, SamplerStateHandler),
]


def get_handler_registry():
    return _handler_registry


def set_handler_registry(registry):
    global _handler_registry
    _handler_registry = registry


def _get_handler(value):
    for handled_type, handler_class in _handler_registry:
        if isinstance(value, handled_type):
            return handler_class(value)
    return None


class TorchState(ObjectState):
    """State of a PyTorch training: ``model``, ``optimizer`` and any other keyword arguments
    (more models, optimizers, ElasticSamplers, or picklable objects), each an attribute.
    Assigning a new model/optimizer/sampler to a tracked attribute saves it at once (Horovod)."""

    def __init__(self, model=None, optimizer=None, **kwargs):
        kwargs.update(model=model, optimizer=optimizer)
        self._handlers = {}
        objects = {}
        for name, value in kwargs.items():
            handler = _get_handler(value)
            if handler is None:
                objects[name] = value
            else:
                self._handlers[name] = handler
        for name, handler in self._handlers.items():
            setattr(self, name, handler.value)
        super().__init__(bcast_object=broadcast_object, get_rank=rank, **objects)

    def save(self):
        for handler in self._handlers.values():
            handler.save()
        super().save()

    def restore(self):
        for handler in self._handlers.values():
            handler.restore()
        super().restore()

    def sync(self):
        # The synced values become the committed ones (as TensorFlowKerasState does), so a
        # restore() after a sync never brings back a rank's own pre-sync values.
        for handler in self._handlers.values():
            handler.sync()
            handler.save()
        super().sync()

    def __setattr__(self, name, value):
        handlers = self.__dict__.get("_handlers")
        if handlers and name in handlers and name in self.__dict__:
            handlers[name].set_value(value)
        super().__setattr__(name, value)

    def _persistent_state(self):
        obj = super()._persistent_state()
        obj["handlers"] = {name: handler.portable() for name, handler in self._handlers.items()}
        return obj

    def _load_persistent_state(self, obj):
        for name, saved in obj.get("handlers", {}).items():
            if name in self._handlers:
                self._handlers[name].load_portable(saved)
        super()._load_persistent_state(obj)
