"""horovod.torch's collective functions, with Horovod's signatures and semantics, on top of
the torch verbs (adapters.torch.ops) and their autograd Functions (adapters.torch.functions)."""
from collectives import basics, objects
from collectives import ops as core
from collectives.constants import Average, resolve_op
from collectives.process_sets import (  # noqa: F401 - re-exported
    ProcessSet,
    add_process_set,
    global_process_set,
    process_set_id,
    remove_process_set,
)

from . import ops as raw
from . import sparse as _sparse
from .compression import Compression
from .functions import (
    AllgatherFn,
    AllreduceFn,
    AlltoallFn,
    BroadcastFn,
    GroupedAllgatherFn,
    GroupedAllreduceFn,
    GroupedReducescatterFn,
    ReducescatterFn,
    needs_graph,
)
from .tensors import poll, synchronize  # noqa: F401 - re-exported (the public ones, which release handles)
from .tensors import wait as _wait


def check_process_set(process_set):
    """Raises unless ``process_set`` is usable here (registered, and this rank a member)."""
    if process_set_id(process_set) != 0 and not process_set.included():  # an unregistered set raises in process_set_id
        raise ValueError(f"rank {basics.rank()} is not a member of {process_set!r}")
    return process_set


def handle_average_backwards_compatibility(op, average):
    """Horovod's rule: ``op`` wins; the deprecated ``average`` bool maps to Average/Sum; default Average."""
    return resolve_op(op, average, stacklevel=4)  # user -> verb -> here


# ---------------------------------------------------------------- allreduce

def allreduce_async(tensor, average=None, name=None, op=None, prescale_factor=1.0, postscale_factor=1.0,
                    process_set=global_process_set):
    """Start an allreduce (no autograd); ``synchronize(handle)`` returns the reduced tensor."""
    check_process_set(process_set)
    op = handle_average_backwards_compatibility(op, average)
    return raw.allreduce_async(tensor, op, name, prescale_factor, postscale_factor, process_set)


def allreduce(tensor, average=None, name=None, compression=Compression.none, op=None, prescale_factor=1.0,
              postscale_factor=1.0, process_set=global_process_set):
    """Reduce ``tensor`` over all ranks (Average by default); differentiable."""
    check_process_set(process_set)
    op = handle_average_backwards_compatibility(op, average)
    compressed, ctx = compression.compress(tensor)
    if needs_graph((compressed,)):
        reduced = AllreduceFn.apply(compressed, op, name, prescale_factor, postscale_factor, process_set)
    else:  # AllreduceFn's forward, without autograd's cost (functions.needs_graph)
        reduced = raw.allreduce(compressed, op, name, prescale_factor, postscale_factor, process_set)
    return compression.decompress(reduced, ctx)


def allreduce_async_(tensor, average=None, name=None, op=None, prescale_factor=1.0, postscale_factor=1.0,
                     process_set=global_process_set):
    """In-place ``allreduce_async``: ``synchronize`` returns ``tensor``, now holding the result."""
    check_process_set(process_set)
    op = handle_average_backwards_compatibility(op, average)
    return raw.allreduce_async_(tensor, op, name, prescale_factor, postscale_factor, process_set)


def allreduce_(tensor, average=None, name=None, op=None, prescale_factor=1.0, postscale_factor=1.0,
               process_set=global_process_set):
    """In-place allreduce (no autograd); returns ``tensor``."""
    check_process_set(process_set)
    op = handle_average_backwards_compatibility(op, average)
    return raw.allreduce_(tensor, op, name, prescale_factor, postscale_factor, process_set)


def grouped_allreduce_async(tensors, average=None, name=None, op=None, prescale_factor=1.0, postscale_factor=1.0,
                            process_set=global_process_set):
    check_process_set(process_set)
    op = handle_average_backwards_compatibility(op, average)
    return raw.grouped_allreduce_async(tensors, op, name, prescale_factor, postscale_factor, process_set)


def grouped_allreduce(tensors, average=None, name=None, compression=Compression.none, op=None,
                      prescale_factor=1.0, postscale_factor=1.0, process_set=global_process_set):
    """Allreduce a list of tensors negotiated and executed together; differentiable."""
    check_process_set(process_set)
    op = handle_average_backwards_compatibility(op, average)
    pairs = [compression.compress(t) for t in tensors]
    compressed = [t for t, _ in pairs]
    if needs_graph(compressed):
        reduced = GroupedAllreduceFn.apply(op, name, prescale_factor, postscale_factor, process_set, *compressed)
    else:  # GroupedAllreduceFn's forward (functions.needs_graph)
        reduced = raw.grouped_allreduce(compressed, op, name, prescale_factor, postscale_factor, process_set)
    return [compression.decompress(t, ctx) for t, (_, ctx) in zip(reduced, pairs)]


def grouped_allreduce_async_(tensors, average=None, name=None, op=None, prescale_factor=1.0,
                             postscale_factor=1.0, process_set=global_process_set):
    check_process_set(process_set)
    op = handle_average_backwards_compatibility(op, average)
    return raw.grouped_allreduce_async_(tensors, op, name, prescale_factor, postscale_factor, process_set)


def grouped_allreduce_(tensors, average=None, name=None, op=None, prescale_factor=1.0, postscale_factor=1.0,
                       process_set=global_process_set):
    """In-place grouped allreduce (no autograd); returns the tensors as a tuple, as Horovod."""
    check_process_set(process_set)
    op = handle_average_backwards_compatibility(op, average)
    return raw.grouped_allreduce_(tensors, op, name, prescale_factor, postscale_factor, process_set)


def sparse_allreduce_async(tensor, name=None, op=Average, process_set=global_process_set):
    """Horovod's reduction of a sparse COO tensor: indices and values are allgathered and the
    result coalesced (Average divides the values by the set's size). Returns a handle for
    ``synchronize`` (or call it, as in Horovod) that gives the sparse result."""
    check_process_set(process_set)
    return _sparse.sparse_allreduce_async(tensor, name, op, process_set)


# ---------------------------------------------------------------- allgather

def allgather_async(tensor, name=None, process_set=global_process_set):
    check_process_set(process_set)
    return raw.allgather_async(tensor, name, process_set)


def allgather(tensor, name=None, process_set=global_process_set):
    """Concatenate every rank's ``tensor`` along the first dimension (which may differ); differentiable."""
    check_process_set(process_set)
    if needs_graph((tensor,)):
        return AllgatherFn.apply(tensor, name, process_set)
    return raw.allgather(tensor, name, process_set)  # AllgatherFn's forward (functions.needs_graph)


def grouped_allgather_async(tensors, name=None, process_set=global_process_set):
    """Start allgathers of a list of tensors, negotiated together; ``synchronize`` returns a tuple (Horovod's)."""
    check_process_set(process_set)
    return raw.grouped_allgather_async(tensors, name, process_set)


def grouped_allgather(tensors, name=None, process_set=global_process_set):
    check_process_set(process_set)
    return tuple(GroupedAllgatherFn.apply(name, process_set, *tensors))  # a tuple, as Horovod


# ---------------------------------------------------------------- broadcast

def broadcast_async(tensor, root_rank, name=None, process_set=global_process_set):
    check_process_set(process_set)
    return raw.broadcast_async(tensor, root_rank, name, process_set)


def broadcast(tensor, root_rank, name=None, process_set=global_process_set):
    """root_rank's ``tensor`` on every rank; differentiable."""
    check_process_set(process_set)
    return BroadcastFn.apply(tensor, root_rank, name, process_set)


def broadcast_async_(tensor, root_rank, name=None, process_set=global_process_set):
    check_process_set(process_set)
    return raw.broadcast_async_(tensor, root_rank, name, process_set)


def broadcast_(tensor, root_rank, name=None, process_set=global_process_set):
    """In-place broadcast (no autograd); returns ``tensor``."""
    return _wait(broadcast_async_(tensor, root_rank, name, process_set))


# ---------------------------------------------------------------- alltoall

def alltoall_async(tensor, splits=None, name=None, process_set=global_process_set):
    """``synchronize(handle)`` returns ``(output, received_splits)``."""
    check_process_set(process_set)
    return raw.alltoall_async(tensor, splits, name, process_set)


def alltoall(tensor, splits=None, name=None, process_set=global_process_set):
    """Rows ``splits[i]`` go to rank i (equal parts without splits). Returns the received
    tensor, or ``(received, received_splits)`` (an int32 tensor) when ``splits`` is given;
    differentiable."""
    check_process_set(process_set)
    output, received_splits = AlltoallFn.apply(tensor, splits, name, process_set)
    return output if splits is None else (output, received_splits)


# ---------------------------------------------------------------- reducescatter

def reducescatter_async(tensor, name=None, op=Average, process_set=global_process_set, prescale_factor=1.0,
                        postscale_factor=1.0):
    check_process_set(process_set)
    return raw.reducescatter_async(tensor, Average if op is None else op, name, prescale_factor, postscale_factor,
                                   process_set)


def reducescatter(tensor, name=None, compression=Compression.none, op=Average, process_set=global_process_set,
                  prescale_factor=1.0, postscale_factor=1.0):
    """Reduce over ranks; rank i keeps block i of the first dimension; differentiable."""
    check_process_set(process_set)
    op = Average if op is None else op
    compressed, ctx = compression.compress(tensor)
    out = ReducescatterFn.apply(compressed, op, name, prescale_factor, postscale_factor, process_set)
    return compression.decompress(out, ctx)


def grouped_reducescatter_async(tensors, name=None, op=Average, process_set=global_process_set, prescale_factor=1.0,
                                postscale_factor=1.0):
    """Start reducescatters of a list of tensors, negotiated together; ``synchronize`` returns a tuple."""
    check_process_set(process_set)
    return raw.grouped_reducescatter_async(tensors, Average if op is None else op, name, prescale_factor,
                                           postscale_factor, process_set)


def grouped_reducescatter(tensors, name=None, compression=Compression.none, op=Average,
                          process_set=global_process_set, prescale_factor=1.0, postscale_factor=1.0):
    check_process_set(process_set)
    op = Average if op is None else op
    pairs = [compression.compress(t) for t in tensors]
    outs = GroupedReducescatterFn.apply(op, name, prescale_factor, postscale_factor, process_set,
                                        *[t for t, _ in pairs])
    return [compression.decompress(t, ctx) for t, (_, ctx) in zip(outs, pairs)]


# ---------------------------------------------------------------- others

def join(device=-1):
    """This rank has no more batches: until every rank has joined, it contributes zeros to the
    others' allreduces (DistributedOptimizer steps). Returns the last rank to join."""
    return core.join(device)


def barrier(process_set=global_process_set):
    """Block until every rank has called barrier."""
    check_process_set(process_set)
    core.barrier(process_set=process_set)


def broadcast_object(obj, root_rank=0, name=None, process_set=global_process_set):
    """root_rank's picklable ``obj`` on every rank."""
    check_process_set(process_set)
    return objects.broadcast_object(obj, root_rank, name, process_set)


def allgather_object(obj, name=None, process_set=global_process_set):
    """The list of every rank's picklable ``obj``, in rank order."""
    check_process_set(process_set)
    return objects.allgather_object(obj, name, process_set)

