"""The framework-agnostic face's dispatch: ``collectives.allreduce(x)`` and the other verbs
hand torch tensors to the PyTorch adapter (autograd, bfloat16, tensors that require grad),
TensorFlow tensors and variables to the TensorFlow adapter (which works inside tf.function),
and everything else (numpy, CuPy and other DLPack producers, buffer-protocol objects) to the
core verbs. The result has the input's type.

Frameworks are recognised by the module of the object's type, so importing collectives
imports neither torch nor TensorFlow; the adapter is imported on first use.
"""
import functools
import importlib
import inspect

import numpy as np

from . import handles as _handles
from . import ops as _core
from .arrays import register_dlpack_importer

_ndarray = np.ndarray
_ADAPTERS = {"torch": "collectives.adapters.torch.mpi_ops", "tensorflow": "collectives.adapters.tensorflow.mpi_ops",
             "keras": "collectives.adapters.tensorflow.mpi_ops"}


def framework_of(obj):
    """'torch', 'tensorflow' or None (numpy and every other array type) for a tensor or a
    list of tensors (judged by its first element)."""
    if isinstance(obj, (list, tuple)) and obj:
        obj = obj[0]
    top = type(obj).__module__.split(".")[0]
    if top == "torch":
        return "torch"
    if top in ("tensorflow", "keras", "tf_keras"):
        return "tensorflow"
    return None


def _adapter(framework):
    return importlib.import_module(_ADAPTERS[framework])


_importers_registered = set()


def _register_importer(framework):
    """The core returns results in the caller's type through DLPack; TensorFlow has no
    top-level ``from_dlpack``, so its adapter's converter is registered on first use."""
    if framework != "tensorflow" or framework in _importers_registered:
        return
    from .adapters.tensorflow.tensors import to_tensor

    for module in ("tensorflow", "keras", "tf_keras"):
        register_dlpack_importer(module, to_tensor)
    _importers_registered.add(framework)


def _dispatching(core_fn):
    """The core verb, sending framework tensors to the same-named verb of their adapter with
    the same keyword arguments (the adapters keep Horovod's names for them)."""
    signature = inspect.signature(core_fn)
    first = next(iter(signature.parameters))

    @functools.wraps(core_fn)
    def verb(*args, **kwargs):
        if args and type(args[0]) is _ndarray:  # the common case, before anything that allocates
            return core_fn(*args, **kwargs)
        framework = framework_of(args[0] if args else kwargs.get(first))
        if framework is None:  # other arrays (CuPy, DLPack producers, buffer-protocol objects)
            return core_fn(*args, **kwargs)
        bound = signature.bind(*args, **kwargs)
        target = getattr(_adapter(framework), core_fn.__name__, None)
        if target is None:  # e.g. TensorFlow has no in-place or async verbs: the core serves them
            _register_importer(framework)
            return core_fn(*args, **kwargs)
        arguments = dict(bound.arguments)
        return target(arguments.pop(first), **arguments)

    return verb


_UNSET = object()  # a parameter the caller left out


def _dispatching_allreduce(core_fn):
    """``_dispatching`` for allreduce and allreduce_, with their parameters spelled out: packing
    ``*args, **kwargs`` for the generic wrapper cost 1.5 of a numpy allreduce's 5.2 us on one
    rank of the 2-core VM (issue 14, latency). Framework tensors get exactly the arguments given,
    as from the generic wrapper, so each adapter's own defaults apply."""
    generic = _dispatching(core_fn)
    defaults = {k: p.default for k, p in inspect.signature(core_fn).parameters.items() if p.default is not p.empty}
    op0, name0, process_set0 = defaults["op"], defaults["name"], defaults["process_set"]
    prescale0, postscale0 = defaults["prescale_factor"], defaults["postscale_factor"]

    @functools.wraps(core_fn)
    def verb(tensor, op=_UNSET, name=_UNSET, prescale_factor=_UNSET, postscale_factor=_UNSET, process_set=_UNSET):
        if type(tensor) is _ndarray:
            return core_fn(tensor, op0 if op is _UNSET else op, name0 if name is _UNSET else name,
                           prescale0 if prescale_factor is _UNSET else prescale_factor,
                           postscale0 if postscale_factor is _UNSET else postscale_factor,
                           process_set0 if process_set is _UNSET else process_set)
        given = {k: v for k, v in (("op", op), ("name", name), ("prescale_factor", prescale_factor),
                                   ("postscale_factor", postscale_factor), ("process_set", process_set))
                 if v is not _UNSET}
        return generic(tensor, **given)

    return verb


_VERBS = ["allreduce", "allreduce_", "allreduce_async", "allreduce_async_", "grouped_allreduce",
          "grouped_allreduce_", "grouped_allreduce_async", "grouped_allreduce_async_", "broadcast", "broadcast_",
          "broadcast_async", "broadcast_async_", "allgather", "allgather_async", "grouped_allgather",
          "grouped_allgather_async", "alltoall", "alltoall_async", "reducescatter", "reducescatter_async",
          "grouped_reducescatter", "grouped_reducescatter_async"]
VERBS = {name: _dispatching(getattr(_core, name)) for name in _VERBS}
VERBS.update({name: _dispatching_allreduce(getattr(_core, name)) for name in ("allreduce", "allreduce_")})


def poll(handle):
    """True when an asynchronous operation (of any face) has finished."""
    if not isinstance(handle, _handles.Handle) and hasattr(handle, "poll"):
        return handle.poll()
    return _handles.poll(handle)


def synchronize(handle):
    """Wait for an asynchronous operation (of any face) and return its result."""
    if not isinstance(handle, _handles.Handle) and hasattr(handle, "wait"):
        return handle.wait()
    return _handles.synchronize(handle)


# ---------------------------------------------------------------- training helpers

def _is_subclass_from(obj, package):
    return any(c.__module__.split(".")[0] == package for c in type(obj).__mro__)


def DistributedOptimizer(optimizer, *args, **kwargs):  # noqa: N802 - Horovod's name
    """Wrap a ``torch.optim.Optimizer`` (-> collectives.torch.DistributedOptimizer) or a Keras
    optimizer (-> collectives.keras.DistributedOptimizer); same arguments as those."""
    if _is_subclass_from(optimizer, "torch"):
        from .adapters.torch.optimizer import DistributedOptimizer as wrap
    elif _is_subclass_from(optimizer, "keras") or _is_subclass_from(optimizer, "tensorflow"):
        from .keras import DistributedOptimizer as wrap
    else:
        raise TypeError(f"DistributedOptimizer takes a torch.optim.Optimizer or a Keras optimizer, not "
                        f"{type(optimizer).__module__}.{type(optimizer).__name__}")
    return wrap(optimizer, *args, **kwargs)


def broadcast_parameters(params, root_rank, process_set=None):
    """PyTorch: broadcast a ``state_dict()`` or ``named_parameters()`` in place (Horovod's
    ``hvd.broadcast_parameters``)."""
    from .adapters.torch.optimizer import broadcast_parameters as torch_broadcast

    return torch_broadcast(params, root_rank, process_set=process_set)


def broadcast_optimizer_state(optimizer, root_rank, model=None, process_set=None):
    """PyTorch: make every rank's optimizer state root_rank's."""
    from .adapters.torch.optimizer import broadcast_optimizer_state as torch_broadcast

    return torch_broadcast(optimizer, root_rank, model=model, process_set=process_set)


def broadcast_variables(variables, root_rank, process_set=None):
    """TensorFlow/Keras: assign root_rank's values to ``variables`` on every rank."""
    from .adapters.tensorflow.mpi_ops import broadcast_variables as tf_broadcast

    return tf_broadcast(variables, root_rank) if process_set is None else tf_broadcast(variables, root_rank,
                                                                                       process_set=process_set)
