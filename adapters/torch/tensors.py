"""torch.Tensor <-> numpy views for the engine, and handles that give torch tensors back.

Contiguous CPU tensors cross with zero copies: ``tensor.detach().numpy()`` shares the
tensor's memory, and results come back through ``torch.from_numpy`` (sharing the engine's
output). bfloat16 has no numpy dtype in torch, so its storage is viewed as int16 bits and
reinterpreted as ``ml_dtypes.bfloat16`` (and the reverse on the way back). Non-contiguous
tensors are accepted (the layer below copies them; in-place results are written back).

CUDA tensors cannot be numpy arrays: ``to_numpy`` passes them through unchanged and
``collectives.ops`` sends them to its GPU path (collectives/device_ops.py), which sees them
through the Kind registered below (pointer, shape, device, the current CUDA stream) and gives
torch tensors back.
"""
import numpy as np
import torch

from collectives import device_arrays
from collectives.constants import DataType
from collectives.errors import InvalidArgumentError, UnsupportedTypeError

_SUPPORTED = {
    torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64,
    torch.float16, torch.bfloat16, torch.float32, torch.float64, torch.bool,
}

_bfloat16 = None


def _bf16_numpy_dtype():
    global _bfloat16
    if _bfloat16 is None:
        try:
            import ml_dtypes
        except ImportError:  # pragma: no cover - ml_dtypes comes with the test tools
            raise UnsupportedTypeError(
                "bfloat16 tensors need the ml_dtypes package (pip install ml_dtypes)") from None
        _bfloat16 = np.dtype(ml_dtypes.bfloat16)
    return _bfloat16


def check_tensor(tensor, what="collective"):
    # The common case first, in the cheapest checks (this runs on every call of every verb).
    if (isinstance(tensor, torch.Tensor) and (tensor.is_cpu or tensor.is_cuda) and tensor.layout is torch.strided
            and tensor.dtype in _SUPPORTED):
        return tensor
    if not isinstance(tensor, torch.Tensor):
        raise InvalidArgumentError(f"{what} takes a torch.Tensor, got {type(tensor).__name__}")
    if tensor.device.type not in ("cpu", "cuda"):
        raise UnsupportedTypeError(
            f"{what}: tensors on device '{tensor.device}' are not supported (collectives.torch takes CPU "
            "and CUDA tensors). Move the tensor with .cpu() or .cuda() first.")
    if tensor.layout != torch.strided:
        raise UnsupportedTypeError(f"{what}: {tensor.layout} tensors are not supported; use a dense tensor")
    if tensor.dtype not in _SUPPORTED:
        raise UnsupportedTypeError(
            f"{what}: collectives does not support dtype {tensor.dtype}; supported: uint8, int8, int16, "
            "int32, int64, float16, bfloat16, float32, float64, bool")
    return tensor


# What a CPU tensor of a supported dtype other than bfloat16 becomes through .numpy().
_SUPPORTED_NUMPY = {np.dtype(t) for t in (np.uint8, np.int8, np.int16, np.int32, np.int64, np.float16, np.float32,
                                          np.float64, np.bool_)}


def to_numpy(tensor, what="collective"):
    """A numpy view sharing ``tensor``'s memory (strided like the tensor); CUDA tensors come
    back as themselves (detached), for the GPU path of collectives.ops."""
    # The common case in one torch call: .numpy() itself refuses what needs the checks below
    # (GPU, sparse and other devices or layouts, tensors that require grad, conjugate or negative
    # views, bfloat16). Each torch attribute read costs 0.2-0.4 us on the 2-core VM: the checks
    # took 4 us of an 11 us 8-byte allreduce_ there (issue 14, latency).
    if isinstance(tensor, torch.Tensor):
        try:
            array = tensor.numpy()
        except (RuntimeError, TypeError):
            pass
        else:
            if array.dtype in _SUPPORTED_NUMPY:
                return array
    t = check_tensor(tensor, what)
    if t.requires_grad:  # .numpy() refuses tensors that require grad; detach() costs a new tensor
        t = t.detach()
    if t.is_conj() or t.is_neg():  # lazy views without materialized memory
        t = t.resolve_conj().resolve_neg()
    if t.is_cuda:
        return t
    if t.dtype == torch.bfloat16:
        return t.view(torch.int16).numpy().view(_bf16_numpy_dtype())
    return t.numpy()


def from_numpy(array):
    """A torch tensor sharing ``array``'s memory (bfloat16 for ml_dtypes.bfloat16 arrays).
    Torch tensors (results of the GPU path) pass through."""
    # The common case first: `dtype.name` below is computed in Python by numpy (about 5 of this
    # function's 9 us on the 2-core VM).
    if type(array) is np.ndarray and array.dtype in _SUPPORTED_NUMPY and array.flags.writeable:
        return torch.from_numpy(array)
    if isinstance(array, torch.Tensor):
        return array
    array = np.asarray(array)
    if array.dtype.name == "bfloat16":
        return torch.from_numpy(_writable(array.view(np.int16))).view(torch.bfloat16)
    return torch.from_numpy(_writable(array))


def _writable(array):
    # torch.from_numpy warns on read-only arrays; engine outputs are writable, so this only
    # copies in unusual cases.
    return array if array.flags.writeable else array.copy()


def from_numpy_like(array, like):
    out = from_numpy(array)
    return out if out.dtype == like.dtype else out.to(like.dtype)


_ENGINE_DTYPES = {
    torch.uint8: DataType.UINT8, torch.int8: DataType.INT8, torch.int16: DataType.INT16,
    torch.int32: DataType.INT32, torch.int64: DataType.INT64, torch.float16: DataType.FLOAT16,
    torch.bfloat16: DataType.BFLOAT16, torch.float32: DataType.FLOAT32, torch.float64: DataType.FLOAT64,
    torch.bool: DataType.BOOL,
}


class _CudaTensors(device_arrays.Kind):
    """How collectives.ops sees CUDA tensors: the producer's stream is torch's current stream
    on the tensor's device (the autograd engine sets it to the stream backward ran on, so
    gradient hooks report the right one); outputs come from torch's caching allocator, and
    engine-allocated ones (allgather, alltoall) are adopted with torch.from_dlpack."""

    def is_device(self, t):
        return isinstance(t, torch.Tensor) and t.is_cuda

    def describe(self, t):
        check_tensor(t)
        stream = torch.cuda.current_stream(t.device).cuda_stream
        return t.data_ptr(), tuple(t.shape), _ENGINE_DTYPES[t.dtype], t.device.index, stream, t.is_contiguous()

    def contiguous(self, t):
        return t.contiguous()

    def empty(self, like, shape, dtype, device):
        return torch.empty(shape, dtype=like.dtype, device=like.device)

    def copy_into(self, dst, src):
        dst.copy_(src)

    def adopt(self, buffer, like):
        return torch.from_dlpack(buffer)


device_arrays.register("torch", _CudaTensors())


class TorchHandle:
    """An asynchronous operation whose result is converted to torch tensors on completion."""

    __slots__ = ("_handle", "_convert", "_done", "_result", "_keep_alive", "_released")

    def __init__(self, handle, convert, keep_alive=None):
        self._handle = handle
        self._convert = convert
        self._done = False
        self._result = None
        self._keep_alive = keep_alive  # the torch tensors whose memory the engine uses
        self._released = False  # the public synchronize() consumed it (collectives.handles.release_after_wait)

    def poll(self):
        return self._done or self._handle.poll()

    def _finished(self):
        """The outcome is collected (result or error), not merely interrupted."""
        return self._done or self._handle._finished()

    def wait(self):
        if not self._done:
            result = self._handle.wait()  # raises the operation's error (again on later waits)
            self._result = self._convert(result)
            self._done = True
            self._keep_alive = None
        return self._result

    def __repr__(self):
        return f"<collectives.torch handle {self._handle!r}>"


def _handle_of(handle):
    from collectives import handles

    if isinstance(handle, (TorchHandle, handles.Handle)):
        return handle
    return handles._check(handle)  # raises ArgumentTypeError: not a handle (Horovod returns None; we say so)


def poll(handle):
    """True when the asynchronous operation has finished (``synchronize`` will not block).
    As in Horovod, ValueError once ``synchronize`` has returned (the handle is released)."""
    from collectives import handles

    return handles.poll_unreleased(_handle_of(handle))


def synchronize(handle):
    """Wait for an asynchronous operation and return its result as torch tensors. As in
    Horovod, this releases the handle: a second call returns None (see
    collectives.handles.release_after_wait; Ctrl-C during the wait keeps it valid)."""
    from collectives import handles

    return handles.release_after_wait(_handle_of(handle))


def wait(handle):
    """The result of ``handle`` (torch or core), for internal callers: unlike the public
    ``synchronize`` it never releases the handle, so it may be called again."""
    return handle.wait()
