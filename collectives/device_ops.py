"""The collective verbs on arrays in GPU memory (PyTorch CUDA tensors, CuPy arrays, other
``__cuda_array_interface__`` producers). ``collectives.ops`` sends GPU arrays here; the
engine runs them on NCCL (see collectives/device_arrays.py for how arrays cross).

Same names, arguments, automatic names and results as the host verbs of ``collectives.ops``
(alltoall's handle gives ``(output, received_splits)``, as there). Out-of-place results are
allocated by the caller's framework on the input's GPU; allgather and alltoall results,
whose size only negotiation tells, are engine-owned GPU memory adopted by the framework
through DLPack. A rank that rejects its own input fails the call on every rank
(collectives/shared_failure.py), as on the host path.
"""
import numpy as np

from . import arguments
from .constants import OpType, ReduceOp
from .device_arrays import DeviceView, require_gpu
from .errors import InvalidArgumentError
from .process_set_registry import process_set_id, set_rank, set_size
from .shared_failure import failing_together
from . import submissions
from .submissions import submit

_reduce_op = arguments.reduce_op


def _name(name, kind, process_set):
    return arguments.name(name, kind, process_set_id(process_set))


def _view(tensor):
    require_gpu()
    return DeviceView(tensor)


def _spec(op, name, view, out, reduce_op=ReduceOp.SUM, root=0, prescale=1.0, postscale=1.0, splits=(), group="",
          group_size=0, process_set=None, shape=None):
    return submissions.submission(int(op), name, input=view.spec(shape), output=None if out is None else out.spec(),
                                  dtype=int(view.dtype), reduce_op=int(reduce_op), root=arguments.root_rank(root),
                                  prescale=arguments.scale_factor(prescale, "prescale_factor"),
                                  postscale=arguments.scale_factor(postscale, "postscale_factor"),
                                  splits=list(splits), group=group, group_size=int(group_size),
                                  process_set=process_set_id(process_set))


# ---------------------------------------------------------------- allreduce

def _allreduce_prepare(tensor, op, name, prescale_factor, postscale_factor, inplace, group="", group_size=0,
                       process_set=None):
    v = _view(tensor)
    out = v if inplace else v.empty()
    spec = _spec(OpType.ALLREDUCE, name, v, out, _reduce_op(op), 0, prescale_factor, postscale_factor, group=group,
                 group_size=group_size, process_set=process_set)
    return v, out, spec


def allreduce_async(tensor, op, name, prescale_factor, postscale_factor, process_set):
    name = _name(name, "allreduce", process_set)
    with failing_together(OpType.ALLREDUCE, [name], process_set):
        v, out, spec = _allreduce_prepare(tensor, op, name, prescale_factor, postscale_factor, False,
                                          process_set=process_set)
    return submit([spec], lambda *_: out.original, (v, out))


def allreduce_async_(tensor, op, name, prescale_factor, postscale_factor, process_set):
    name = _name(name, "allreduce", process_set)
    with failing_together(OpType.ALLREDUCE, [name], process_set):
        v, out, spec = _allreduce_prepare(tensor, op, name, prescale_factor, postscale_factor, True,
                                          process_set=process_set)
    return submit([spec], lambda *_: v.write_back(), v)


def grouped_allreduce_async(tensors, op, name, prescale_factor, postscale_factor, inplace, process_set):
    tensors = list(tensors)
    group = _name(name, "grouped_allreduce", process_set)
    names = arguments.member_names(group, len(tensors))
    with failing_together(OpType.ALLREDUCE, names, process_set, group, len(tensors)):
        prepared = [_allreduce_prepare(t, op, n, prescale_factor, postscale_factor, inplace, group, len(tensors),
                                       process_set)
                    for n, t in zip(names, tensors)]
    if inplace:
        finish = lambda *_: [v.write_back() for v, _, _ in prepared]  # noqa: E731
    else:
        finish = lambda *_: [out.original for _, out, _ in prepared]  # noqa: E731
    return submit([spec for _, _, spec in prepared], finish, prepared)


# ---------------------------------------------------------------- broadcast

def broadcast_async(tensor, root_rank, name, process_set):
    name = _name(name, "broadcast", process_set)
    with failing_together(OpType.BROADCAST, [name], process_set):
        v = _view(tensor)
        out = v.empty()
        spec = _spec(OpType.BROADCAST, name, v, out, root=root_rank, process_set=process_set)
    return submit([spec], lambda *_: out.original, (v, out))


def broadcast_async_(tensor, root_rank, name, process_set):
    name = _name(name, "broadcast", process_set)
    with failing_together(OpType.BROADCAST, [name], process_set):
        v = _view(tensor)
        spec = _spec(OpType.BROADCAST, name, v, v, root=root_rank, process_set=process_set)
    return submit([spec], lambda *_: v.write_back(), v)


# ---------------------------------------------------------------- allgather

def _allgather_prepare(tensor, name, group="", group_size=0, process_set=None):
    v = _view(tensor)
    shape = v.shape if len(v.shape) > 0 else (1,)  # a scalar gathers as one row
    spec = _spec(OpType.ALLGATHER, name, v, None, group=group, group_size=group_size, process_set=process_set,
                 shape=shape)
    return v, spec, lambda outcome: v.adopt(outcome[2])


def allgather_async(tensor, name, process_set):
    name = _name(name, "allgather", process_set)
    with failing_together(OpType.ALLGATHER, [name], process_set):
        v, spec, finish = _allgather_prepare(tensor, name, process_set=process_set)
    return submit([spec], lambda outcomes, _: finish(outcomes[0]), v)


def grouped_allgather_async(tensors, name, process_set):
    tensors = list(tensors)
    group = _name(name, "grouped_allgather", process_set)
    names = arguments.member_names(group, len(tensors))
    with failing_together(OpType.ALLGATHER, names, process_set, group, len(tensors)):
        prepared = [_allgather_prepare(t, n, group, len(tensors), process_set) for n, t in zip(names, tensors)]
    finish = lambda outcomes, _: [f(o) for (_, _, f), o in zip(prepared, outcomes)]  # noqa: E731
    return submit([spec for _, spec, _ in prepared], finish, [v for v, _, _ in prepared])


# ---------------------------------------------------------------- alltoall

def alltoall_async(tensor, splits, name, process_set):
    name = _name(name, "alltoall", process_set)
    with failing_together(OpType.ALLTOALL, [name], process_set):
        v = _view(tensor)
        spec = _spec(OpType.ALLTOALL, name, v, None, splits=arguments.splits(splits), process_set=process_set)

    def finish(outcomes, _):
        # Always both, as the host path's handles; the splits stay on the host, as in Horovod.
        buffer, _, received = outcomes[0][2:5]
        return v.adopt(buffer), np.asarray(received, dtype=np.int32)

    return submit([spec], finish, v)


# ---------------------------------------------------------------- reducescatter

def _reducescatter_prepare(tensor, op, name, prescale_factor, postscale_factor, group="", group_size=0,
                           process_set=None):
    v = _view(tensor)
    if len(v.shape) == 0:
        raise InvalidArgumentError(f"reducescatter needs a tensor with at least one dimension (tensor '{name}')")
    n, r = set_size(process_set), set_rank(process_set)
    rows = v.shape[0] // n + (1 if r < v.shape[0] % n else 0)
    out = v.empty((rows,) + tuple(v.shape[1:]))
    spec = _spec(OpType.REDUCESCATTER, name, v, out, _reduce_op(op), 0, prescale_factor, postscale_factor,
                 group=group, group_size=group_size, process_set=process_set)
    return v, out, spec


def reducescatter_async(tensor, op, name, prescale_factor, postscale_factor, process_set):
    name = _name(name, "reducescatter", process_set)
    with failing_together(OpType.REDUCESCATTER, [name], process_set):
        v, out, spec = _reducescatter_prepare(tensor, op, name, prescale_factor, postscale_factor,
                                              process_set=process_set)
    return submit([spec], lambda *_: out.original, (v, out))


def grouped_reducescatter_async(tensors, op, name, prescale_factor, postscale_factor, process_set):
    tensors = list(tensors)
    group = _name(name, "grouped_reducescatter", process_set)
    names = arguments.member_names(group, len(tensors))
    with failing_together(OpType.REDUCESCATTER, names, process_set, group, len(tensors)):
        prepared = [_reducescatter_prepare(t, op, n, prescale_factor, postscale_factor, group, len(tensors),
                                           process_set)
                    for n, t in zip(names, tensors)]
    return submit([spec for _, _, spec in prepared], lambda *_: [out.original for _, out, _ in prepared], prepared)
