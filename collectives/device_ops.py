"""The collective verbs on arrays in GPU memory (PyTorch CUDA tensors, CuPy arrays, other
``__cuda_array_interface__`` producers). ``collectives.ops`` sends GPU arrays here; the
engine runs them on NCCL (see collectives/device_arrays.py for how arrays cross).

Same names, arguments, automatic names and results as the host verbs of ``collectives.ops``.
Out-of-place results are allocated by the caller's framework on the input's GPU; allgather
and alltoall results, whose size only negotiation tells, are engine-owned GPU memory adopted
by the framework through DLPack.
"""
import numpy as np

from .constants import OpType, ReduceOp
from .device_arrays import DeviceView, require_gpu
from .errors import InvalidArgumentError
from .handles import submit
from .ops import _auto_name, _reduce_op
from .process_sets import process_set_id, set_rank, set_size


def _view(tensor):
    require_gpu()
    return DeviceView(tensor)


def _spec(op, name, view, out, reduce_op=ReduceOp.SUM, root=0, prescale=1.0, postscale=1.0, splits=(), group="",
          group_size=0, process_set=None, shape=None):
    return (int(op), name, view.spec(shape), None if out is None else out.spec(), int(view.dtype), int(reduce_op),
            int(root), float(prescale), float(postscale), [int(s) for s in splits], group, int(group_size),
            process_set_id(process_set))


# ---------------------------------------------------------------- allreduce

def _allreduce_prepare(tensor, op, name, prescale_factor, postscale_factor, inplace, group="", group_size=0,
                       process_set=None):
    v = _view(tensor)
    out = v if inplace else v.empty()
    spec = _spec(OpType.ALLREDUCE, name, v, out, _reduce_op(op), 0, prescale_factor, postscale_factor, group=group,
                 group_size=group_size, process_set=process_set)
    return v, out, spec


def allreduce_async(tensor, op, name, prescale_factor, postscale_factor, process_set):
    name = name or _auto_name("allreduce", process_set)
    v, out, spec = _allreduce_prepare(tensor, op, name, prescale_factor, postscale_factor, False,
                                      process_set=process_set)
    return submit([spec], lambda _: out.original, (v, out))


def allreduce_async_(tensor, op, name, prescale_factor, postscale_factor, process_set):
    name = name or _auto_name("allreduce", process_set)
    v, out, spec = _allreduce_prepare(tensor, op, name, prescale_factor, postscale_factor, True,
                                      process_set=process_set)
    return submit([spec], lambda _: v.write_back(), v)


def grouped_allreduce_async(tensors, op, name, prescale_factor, postscale_factor, inplace, process_set):
    tensors = list(tensors)
    group = name or _auto_name("grouped_allreduce", process_set)
    prepared = [_allreduce_prepare(t, op, f"{group}.{i}", prescale_factor, postscale_factor, inplace, group,
                                   len(tensors), process_set)
                for i, t in enumerate(tensors)]
    if inplace:
        finish = lambda _: [v.write_back() for v, _, _ in prepared]  # noqa: E731
    else:
        finish = lambda _: [out.original for _, out, _ in prepared]  # noqa: E731
    return submit([spec for _, _, spec in prepared], finish, prepared)


# ---------------------------------------------------------------- broadcast

def broadcast_async(tensor, root_rank, name, process_set):
    name = name or _auto_name("broadcast", process_set)
    v = _view(tensor)
    out = v.empty()
    spec = _spec(OpType.BROADCAST, name, v, out, root=root_rank, process_set=process_set)
    return submit([spec], lambda _: out.original, (v, out))


def broadcast_async_(tensor, root_rank, name, process_set):
    name = name or _auto_name("broadcast", process_set)
    v = _view(tensor)
    spec = _spec(OpType.BROADCAST, name, v, v, root=root_rank, process_set=process_set)
    return submit([spec], lambda _: v.write_back(), v)


# ---------------------------------------------------------------- allgather

def _allgather_prepare(tensor, name, group="", group_size=0, process_set=None):
    v = _view(tensor)
    shape = v.shape if len(v.shape) > 0 else (1,)  # a scalar gathers as one row
    spec = _spec(OpType.ALLGATHER, name, v, None, group=group, group_size=group_size, process_set=process_set,
                 shape=shape)
    return v, spec, lambda outcome: v.adopt(outcome[2])


def allgather_async(tensor, name, process_set):
    name = name or _auto_name("allgather", process_set)
    v, spec, finish = _allgather_prepare(tensor, name, process_set=process_set)
    return submit([spec], lambda outcomes: finish(outcomes[0]), v)


def grouped_allgather_async(tensors, name, process_set):
    tensors = list(tensors)
    group = name or _auto_name("grouped_allgather", process_set)
    prepared = [_allgather_prepare(t, f"{group}.{i}", group, len(tensors), process_set)
                for i, t in enumerate(tensors)]
    finish = lambda outcomes: [f(o) for (_, _, f), o in zip(prepared, outcomes)]  # noqa: E731
    return submit([spec for _, spec, _ in prepared], finish, [v for v, _, _ in prepared])


# ---------------------------------------------------------------- alltoall

def alltoall_async(tensor, splits, name, process_set):
    name = name or _auto_name("alltoall", process_set)
    v = _view(tensor)
    split_list = [] if splits is None else [int(s) for s in np.asarray(splits).reshape(-1)]
    spec = _spec(OpType.ALLTOALL, name, v, None, splits=split_list, process_set=process_set)

    def finish(outcomes):
        buffer, _, received = outcomes[0][2:5]
        output = v.adopt(buffer)
        if splits is None:
            return output
        return output, np.asarray(received, dtype=np.int32)  # splits stay on the host, as in Horovod

    return submit([spec], finish, v)


# ---------------------------------------------------------------- reducescatter

def _reducescatter_prepare(tensor, op, name, prescale_factor, postscale_factor, group="", group_size=0,
                           process_set=None):
    v = _view(tensor)
    if len(v.shape) == 0:
        raise InvalidArgumentError("reducescatter needs a tensor with at least one dimension")
    n, r = set_size(process_set), set_rank(process_set)
    rows = v.shape[0] // n + (1 if r < v.shape[0] % n else 0)
    out = v.empty((rows,) + tuple(v.shape[1:]))
    spec = _spec(OpType.REDUCESCATTER, name, v, out, _reduce_op(op), 0, prescale_factor, postscale_factor,
                 group=group, group_size=group_size, process_set=process_set)
    return v, out, spec


def reducescatter_async(tensor, op, name, prescale_factor, postscale_factor, process_set):
    name = name or _auto_name("reducescatter", process_set)
    v, out, spec = _reducescatter_prepare(tensor, op, name, prescale_factor, postscale_factor,
                                          process_set=process_set)
    return submit([spec], lambda _: out.original, (v, out))


def grouped_reducescatter_async(tensors, op, name, prescale_factor, postscale_factor, process_set):
    tensors = list(tensors)
    group = name or _auto_name("grouped_reducescatter", process_set)
    prepared = [_reducescatter_prepare(t, op, f"{group}.{i}", prescale_factor, postscale_factor, group,
                                       len(tensors), process_set)
                for i, t in enumerate(tensors)]
    return submit([spec for _, _, spec in prepared], lambda _: [out.original for _, out, _ in prepared], prepared)
