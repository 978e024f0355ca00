"""The helpers of Horovod's ``horovod.common.util`` that its faces re-export, so scripts reach
them as ``hvd.gpu_available('tensorflow')``, ``hvd.split_list`` (horovod.tensorflow) and
``hvd.is_version_greater_equal_than`` (horovod.tensorflow.keras). Written from Horovod's
documented behaviour; this module imports no framework until a question needs one."""
import functools
import importlib
import re


def _tensorflow_sees_gpu():
    return bool(importlib.import_module("tensorflow").config.list_physical_devices("GPU"))


def _torch_sees_gpu():
    return bool(importlib.import_module("torch").cuda.is_available())


# The frameworks Horovod asks (its extension names); any other name has no GPU to report.
_GPU_PROBES = {"tensorflow": _tensorflow_sees_gpu, "torch": _torch_sees_gpu}


@functools.lru_cache(maxsize=None)
def gpu_available(ext_base_name, verbose=False):
    """True when framework ``ext_base_name`` ('tensorflow', 'torch') is installed and sees a GPU;
    False otherwise, also for a framework that is missing or fails to load (as Horovod, which
    answers False when its extension cannot be imported). Cached, as Horovod's."""
    if verbose:
        print(f"Checking whether extension {ext_base_name} was running with GPU.")
    probe = _GPU_PROBES.get(ext_base_name)
    try:
        result = bool(probe()) if probe is not None else False
    except Exception:  # noqa: BLE001 - a framework that cannot load has no GPU to offer
        result = False
    if verbose:
        print(f"Extension {ext_base_name} {'was' if result else 'was NOT'} running with GPU.")
    return result


def split_list(items, n):
    """``items`` in ``n`` consecutive parts whose lengths differ by at most one (the first
    ``len(items) % n`` parts are the longer ones)."""
    d, r = divmod(len(items), n)
    return [items[i * d + min(i, r):(i + 1) * d + min(i + 1, r)] for i in range(n)]


def _release(text):
    """The leading numbers of a version string: '2.21.0rc1' -> (2, 21, 0)."""
    return tuple(int(part) for part in re.findall(r"\d+", re.match(r"[\d.]*", text).group()))


def is_version_greater_equal_than(ver, target):
    """``ver >= target`` for version strings; ``target`` must be 'major.minor.patch'. Both must be
    str (ValueError otherwise, as Horovod's)."""
    if not isinstance(ver, str) or not isinstance(target, str):
        raise ValueError(f"is_version_greater_equal_than accepts str arguments only, got "
                         f"{type(ver).__name__} ({ver!r}) and {type(target).__name__} ({target!r})")
    if len(target.split(".")) != 3:
        raise ValueError(f"target version must be of the form major.minor.patch, got {target!r}")
    try:
        from packaging import version
    except ImportError:  # packaging comes with TensorFlow and pip; compare the release numbers then
        return _release(ver) >= _release(target)
    return version.parse(ver) >= version.parse(target)
