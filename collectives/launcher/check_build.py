"""``collectivesrun --check-build``: what this installation can use, in horovodrun's layout.

Nothing heavy is imported: frameworks are found with ``importlib.util.find_spec`` and their
versions read from package metadata; the MPI library is asked for its version without being
initialized; NCCL and CUDA are probed by ``collectives.gpu_libs``.
"""
import importlib.metadata
import importlib.util
import re
import sys

from .. import __version__, gpu_libs
from . import mpi_locator

# (label, import name, distributions that may provide it, in order of likelihood)
FRAMEWORKS = (
    ("PyTorch", "torch", ("torch",)),
    ("TensorFlow", "tensorflow", ("tensorflow", "tensorflow-cpu", "tensorflow-gpu", "tf-nightly",
                                  "tensorflow-macos", "intel-tensorflow")),
    ("Keras", "keras", ("keras", "keras-nightly")),
)


def framework_version(module, distributions):
    """The installed version of ``module``, or None if it cannot be imported."""
    try:
        if importlib.util.find_spec(module) is None:
            return None
    except (ImportError, ValueError):
        return None
    for dist in distributions:
        try:
            return importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            continue
    for dist in importlib.metadata.packages_distributions().get(module, ()):
        try:
            return importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            continue
    return "(version unknown)"


def mpi_library():
    """(one-line library version, (major, minor) of the MPI standard) from the engine's own
    libmpi, or raises. MPI_Get_library_version may be called before MPI_Init; initializing here
    would only make this process a singleton rank."""
    import mpi4py

    if "mpi4py.MPI" not in sys.modules:
        mpi4py.rc.initialize = False
        mpi4py.rc.finalize = False
    from mpi4py import MPI  # noqa: F401  (loads libmpi, which the engine binds to)

    from .. import _engine

    first_line = _engine.mpi_library_version().strip().splitlines()[0]
    text = re.sub(r"\s+", " ", first_line).split(", package:")[0]  # Open MPI adds build details
    return text, tuple(_engine.mpi_version())


def _mark(flag):
    return "[X]" if flag else "[ ]"


def report(environ=None) -> str:
    lines = [f"collectives v{__version__}:", ""]

    lines.append("MPI:")
    mpi_ok = False
    try:
        library, standard = mpi_library()
        mpi_ok = True
        lines.append(f"    [X] {library} (MPI {standard[0]}.{standard[1]})")
    except Exception as e:  # noqa: BLE001 - any failure to load the engine is what we report
        lines.append(f"    [ ] the engine cannot load its MPI: {type(e).__name__}: {e}")
    engine = mpi_locator.engine_mpi()
    if engine and engine.soname:
        where = f"{engine.library_dir}/{engine.soname}" if engine.library_dir else f"{engine.soname} (system path)"
        lines.append(f"    engine linked against: {where}")
    try:
        launcher = mpi_locator.locate(environ)
        lines.append(f"    launcher: {launcher.describe()}")
        lines += [f"    warning: {w}" for w in launcher.warnings]
    except mpi_locator.LauncherError as e:
        lines.append(f"    launcher: {e}")

    lines += ["", "Available frameworks:"]
    for label, module, dists in FRAMEWORKS:
        version = framework_version(module, dists)
        lines.append(f"    {_mark(version)} {label}" + (f" {version}" if version else ""))

    lines += ["", "Available controllers:", f"    {_mark(mpi_ok)} MPI", "    [ ] Gloo"]

    nccl = gpu_libs.search_nccl(environ)
    cuda = gpu_libs.probe_cuda()
    lines += ["", "Available tensor operations:", f"    {_mark(mpi_ok)} MPI"]
    if nccl.found:
        lines.append(f"    [X] NCCL {nccl.found.version_string} ({nccl.found.path}, from {nccl.found.source})")
    else:
        lines.append(f"    [ ] NCCL: {nccl.describe_failure()}")
    if cuda.available:
        lines.append(f"    [X] CUDA driver {cuda.driver.version_string}, {cuda.device_count} device(s)")
    else:
        lines.append(f"    [ ] CUDA: {cuda.problem}")
    if cuda.runtime:
        lines.append(f"        CUDA runtime {cuda.runtime.version_string}: {cuda.runtime.path}")
    return "\n".join(lines)
