"""Arrays in GPU memory for the framework-agnostic verbs: recognising them, describing them to
the engine, allocating outputs, and giving results back in the caller's type.

The engine cannot take GPU memory as numpy arrays; a GPU array crosses as an
``engine.DeviceTensor(ptr, shape, device, stream)``, where ``stream`` is the producer's current stream (the
engine records an event on it at enqueue and its NCCL stream waits on that event). Kinds:

* PyTorch CUDA tensors (registered by ``collectives.adapters.torch.tensors``): stream
  ``torch.cuda.current_stream(device)``, outputs from torch's allocator, engine outputs
  adopted with ``torch.from_dlpack``.
* CuPy arrays: ``__cuda_array_interface__`` for pointer, shape and dtype, the interface's
  ``stream`` or CuPy's current stream, outputs from CuPy's allocator, ``cupy.from_dlpack``.
* Any other ``__cuda_array_interface__`` producer (Numba, ...): outputs are engine-owned
  ``DeviceBuffer`` objects (they export ``__cuda_array_interface__`` and ``__dlpack__``).

Results are complete when ``synchronize`` returns (the engine waits for the GPU on the
host), so the consumer may use them on any stream. Nothing here imports a framework.
"""
import numpy as np

from .arrays import engine_dtype
from .constants import DataType
from .errors import InvalidArgumentError, UnsupportedTypeError, raise_for_status

KDL_CUDA = 2
KDL_CUDA_MANAGED = 13
LEGACY_STREAM = 1  # CUDA's legacy default stream, as DLPack and __cuda_array_interface__ number it
UNKNOWN_DEVICE = -2  # the engine asks the driver which GPU holds the pointer


class Kind:
    """How one framework's GPU arrays are seen. Subclasses override what differs."""

    def is_device(self, x):
        return True

    def describe(self, x):
        """(data_ptr, shape, engine dtype, device, stream, C-contiguous)."""
        raise NotImplementedError

    def contiguous(self, x):
        raise UnsupportedTypeError(f"non-contiguous GPU arrays of type {_type_name(x)} are not supported; "
                                   "pass a contiguous array")

    def empty(self, like, shape, dtype, device):
        """A new array on ``device`` (None: engine-owned memory)."""
        return _device_empty(shape, dtype, device)

    def copy_into(self, dst, src):
        raise UnsupportedTypeError(f"cannot write back into a non-contiguous {_type_name(dst)}")

    def adopt(self, buffer, like):
        """A DeviceBuffer (engine-owned GPU memory) as the caller's type."""
        return buffer


class ArrayInterfaceKind(Kind):
    """Producers of ``__cuda_array_interface__`` (version 2 or 3)."""

    def describe(self, x):
        cai = x.__cuda_array_interface__
        shape = tuple(int(d) for d in cai["shape"])
        dtype = np.dtype(cai["typestr"])
        strides = cai.get("strides")
        contiguous = strides is None or tuple(strides) == _c_strides(shape, dtype.itemsize)
        stream = cai.get("stream")
        if stream is None:  # "no synchronization needed": any stream will do
            stream = self.current_stream(x)
        return int(cai["data"][0]), shape, engine_dtype(dtype), self.device_of(x), int(stream), contiguous

    def current_stream(self, x):
        return LEGACY_STREAM

    def device_of(self, x):
        return UNKNOWN_DEVICE


class CupyKind(ArrayInterfaceKind):
    def current_stream(self, x):
        import cupy

        with x.device:
            return cupy.cuda.get_current_stream().ptr or LEGACY_STREAM

    def device_of(self, x):
        return int(x.device.id)

    def contiguous(self, x):
        import cupy

        with x.device:
            return cupy.ascontiguousarray(x)

    def empty(self, like, shape, dtype, device):
        import cupy

        with cupy.cuda.Device(device if device >= 0 else like.device.id):
            return cupy.empty(shape, dtype=like.dtype)

    def copy_into(self, dst, src):
        dst[...] = src

    def adopt(self, buffer, like):
        import cupy

        return cupy.from_dlpack(buffer)


_KINDS = {"cupy": CupyKind()}
_ARRAY_INTERFACE = ArrayInterfaceKind()


def register(module_name, kind):
    """Adapters register how their framework's GPU tensors are seen (by top-level module)."""
    _KINDS[module_name] = kind


def kind_of(x):
    """The Kind of a GPU array, or None for host arrays. UnsupportedTypeError for GPU arrays
    collectives cannot take (DLPack-only producers)."""
    if isinstance(x, np.ndarray):
        return None
    top = type(x).__module__.split(".")[0]
    kind = _KINDS.get(top)
    if kind is not None:
        return kind if kind.is_device(x) else None
    try:
        if hasattr(x, "__cuda_array_interface__"):
            return _ARRAY_INTERFACE
    except Exception:  # a property that raises for host arrays
        return None
    dlpack_device = getattr(x, "__dlpack_device__", None)
    if dlpack_device is not None:
        try:
            device_type = dlpack_device()[0]
        except Exception:
            return None
        if device_type in (KDL_CUDA, KDL_CUDA_MANAGED):
            raise UnsupportedTypeError(
                f"collectives takes GPU arrays of PyTorch, CuPy or any __cuda_array_interface__ producer; "
                f"{_type_name(x)} offers only DLPack")
    return None


def on_device(x):
    """True for an array in GPU memory (the common numpy case pays one isinstance)."""
    if isinstance(x, np.ndarray):
        return False
    if isinstance(x, (list, tuple)):
        return bool(x) and kind_of(x[0]) is not None
    return kind_of(x) is not None


class DeviceView:
    """A GPU array as the engine sees it. ``array`` is C-contiguous: the user's array, or a
    contiguous copy of it (written back after in-place operations)."""

    __slots__ = ("original", "array", "kind", "ptr", "shape", "dtype", "device", "stream")

    def __init__(self, x, kind=None):
        self.original = x
        self.kind = kind or kind_of(x)
        if self.kind is None:
            raise InvalidArgumentError(f"expected an array in GPU memory, got {_type_name(x)}")
        ptr, shape, dtype, device, stream, contiguous = self.kind.describe(x)
        self.array = x
        if not contiguous:
            self.array = self.kind.contiguous(x)
            ptr, shape, dtype, device, stream, _ = self.kind.describe(self.array)
        if device < 0:
            # An empty array may own no memory (data pointer 0): nothing for the driver to place.
            device = _device_of_pointer(ptr) if ptr else _device_of_empty()
        self.ptr, self.shape, self.dtype, self.device, self.stream = ptr, shape, dtype, device, stream

    def spec(self, shape=None):
        """What the engine takes for this array: an engine.DeviceTensor."""
        from ._loader import engine_module

        shape = list(self.shape if shape is None else shape)
        return engine_module().DeviceTensor(self.ptr, shape, self.device, self.stream)

    def empty(self, shape=None):
        """A view of a new array like this one (``shape`` if given) on the same GPU."""
        shape = self.shape if shape is None else tuple(shape)
        return DeviceView(self.kind.empty(self.array, shape, self.dtype, self.device), self.kind)

    def write_back(self):
        """After an in-place operation on a contiguous copy: copy it into the user's array."""
        if self.array is not self.original:
            self.kind.copy_into(self.original, self.array)
        return self.original

    def adopt(self, buffer):
        return self.kind.adopt(buffer, self.original)


_gpu_ready = False


def require_gpu():
    """UnsupportedTypeError (with the reason) unless the engine can use GPUs in this process."""
    global _gpu_ready
    from . import basics

    basics.engine()  # NotInitializedError first
    if _gpu_ready:
        return
    from ._loader import engine_module

    info = engine_module().gpu_info()
    if not info["available"]:
        raise UnsupportedTypeError(
            "this array is in GPU memory, but collectives cannot use GPUs here: " + info["problem"])
    _gpu_ready = True  # the libraries stay loaded for the life of the process


def _device_of_pointer(ptr):
    from ._loader import engine_module

    code, message, device = engine_module().device_of_pointer(int(ptr))
    raise_for_status(code, message)
    return device


def _device_of_empty():
    """This process's GPU: the one its GPU collectives use, else its local rank's."""
    from . import basics, gpu_libs

    engine = basics.engine()
    if engine.gpu_device >= 0:
        return engine.gpu_device
    count = gpu_libs.cuda_device_count()
    return engine.local_rank % count if count > 0 else 0


def _device_empty(shape, dtype, device):
    """Engine-owned GPU memory (for producers whose allocator collectives does not know)."""
    from ._loader import engine_module

    code, message, buffer = engine_module().device_empty([int(d) for d in shape], int(DataType(dtype)), int(device))
    raise_for_status(code, message)
    return buffer


def _c_strides(shape, itemsize):
    strides, step = [], itemsize
    for d in reversed(shape):
        strides.append(step)
        step *= max(d, 1)
    return tuple(reversed(strides))


def _type_name(x):
    return f"{type(x).__module__}.{type(x).__name__}"
