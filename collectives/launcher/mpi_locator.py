"""Finds the MPI launcher (mpirun/mpiexec) that belongs to the MPI the engine was built with.

Ranks started by another MPI's launcher do not see each other (each one becomes a singleton
world of size 1), so the launcher must match the engine's libmpi. Search order:

1. ``$COLLECTIVES_MPIRUN`` - an explicit path or command name; if it is wrong we say so
   rather than silently use another MPI.
2. The ``bin/`` of the MPI the engine links: setup.py links the engine with an rpath to the
   library directory of the MPI whose mpicc it used, and elf_deps reads it back.
3. ``mpirun``/``mpiexec`` beside the running Python (the pip ``mpich`` wheel), the same rule
   setup.py uses for mpicc.
4. Beside ``$COLLECTIVES_MPICC`` when that is set (a build against a system MPI).
5. ``PATH``.
"""
import importlib.util
import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from typing import List, Optional, Tuple

from .elf_deps import read_dynamic

LAUNCHER_NAMES = ("mpirun", "mpiexec", "mpiexec.hydra")
VERSION_TIMEOUT_S = 15

HYDRA = "hydra"  # MPICH, Intel MPI, MVAPICH: -genv, -hosts, -launcher
OPEN_MPI = "openmpi"  # -x, -H, --oversubscribe, --mca
UNKNOWN = "unknown"


class LauncherError(Exception):
    """No usable MPI launcher; the message is one line for the user."""


@dataclass(frozen=True)
class EngineMpi:
    """The libmpi the compiled engine needs and the directory its rpath finds it in."""
    engine_path: str
    soname: Optional[str]
    library_dir: Optional[str]


@dataclass
class MpiLauncher:
    path: str
    flavor: str  # HYDRA, OPEN_MPI or UNKNOWN
    implementation: str  # "MPICH", "Intel MPI", "MVAPICH", "Open MPI", or "unknown"
    version: str
    found_by: str  # which rule of the search order picked it
    warnings: List[str] = field(default_factory=list)

    def describe(self):
        return f"{self.path} ({self.implementation} {self.version}, found via {self.found_by})"


def engine_mpi() -> Optional[EngineMpi]:
    """Where the engine's libmpi comes from, read from the engine binary; None if not built."""
    spec = importlib.util.find_spec("collectives._engine")
    if spec is None or not spec.origin:
        return None
    info = read_dynamic(spec.origin)
    if info is None:
        return EngineMpi(spec.origin, None, None)
    soname = next((n for n in info.needed if re.match(r"lib(mpi|mpich|mpi_abi)\.so", n)), None)
    library_dir = None
    if soname:
        library_dir = next((d for d in info.search_dirs if os.path.exists(os.path.join(d, soname))), None)
    return EngineMpi(spec.origin, soname, library_dir)


def _launcher_in(directory) -> Optional[str]:
    for name in LAUNCHER_NAMES:
        path = os.path.join(directory, name)
        if os.path.isfile(path) and os.access(path, os.X_OK):
            return path
    return None


def _candidates(environ, engine) -> List[Tuple[str, str]]:
    found = []
    if engine is not None and engine.library_dir:
        prefix = os.path.dirname(engine.library_dir.rstrip("/"))
        # <prefix>/lib -> <prefix>/bin; multiarch layouts (<prefix>/lib/x86_64-linux-gnu) one more up.
        for bindir in (os.path.join(prefix, "bin"), os.path.join(os.path.dirname(prefix), "bin")):
            path = _launcher_in(bindir)
            if path:
                found.append((path, f"the engine's MPI in {engine.library_dir}"))
                break
    path = _launcher_in(os.path.dirname(sys.executable))
    if path:
        found.append((path, "beside the Python interpreter"))
    mpicc = environ.get("COLLECTIVES_MPICC")
    if mpicc:
        path = _launcher_in(os.path.dirname(os.path.abspath(mpicc)))
        if path:
            found.append((path, "beside $COLLECTIVES_MPICC"))
    for name in LAUNCHER_NAMES[:2]:
        path = shutil.which(name, path=environ.get("PATH"))
        if path:
            found.append((path, "PATH"))
            break
    return found


def identify(path) -> Tuple[str, str, str]:
    """(flavor, implementation, version) from ``<launcher> --version``."""
    try:
        proc = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=VERSION_TIMEOUT_S,
                              stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        raise LauncherError(f"MPI launcher {path} did not answer --version within {VERSION_TIMEOUT_S} s") from None
    except OSError as e:
        raise LauncherError(f"MPI launcher {path} cannot be run: {e.strerror or e}") from None
    text = proc.stdout + proc.stderr
    if "Open MPI" in text or "OpenRTE" in text:
        m = re.search(r"\((?:Open MPI|OpenRTE)\)\s*(\S+)", text)
        return OPEN_MPI, "Open MPI", m.group(1) if m else "?"
    if "HYDRA" in text or "Intel(R) MPI" in text:
        implementation = "Intel MPI" if "Intel(R) MPI" in text else "MVAPICH" if "MVAPICH" in text else "MPICH"
        m = re.search(r"Version:?\s*(\S+)", text)
        return HYDRA, implementation, m.group(1) if m else "?"
    return UNKNOWN, "unknown", "?"


def _mismatch_warning(launcher_flavor, engine) -> Optional[str]:
    """Open MPI's libmpi is libmpi.so.40; MPICH-ABI libraries (MPICH, Intel MPI) are .so.12."""
    if engine is None or not engine.soname:
        return None
    engine_is_open_mpi = engine.soname.startswith("libmpi.so.4")
    engine_is_mpich_abi = engine.soname.startswith(("libmpi.so.12", "libmpich.so"))
    if (launcher_flavor == OPEN_MPI and engine_is_mpich_abi) or (launcher_flavor == HYDRA and engine_is_open_mpi):
        return (f"the launcher looks like a different MPI than the engine's {engine.soname}; ranks may each "
                f"start alone (size 1). Set COLLECTIVES_MPIRUN to the mpirun of the MPI the engine was built with.")
    return None


def locate(environ=None) -> MpiLauncher:
    """The launcher to use, identified; LauncherError with a one-line reason otherwise."""
    environ = os.environ if environ is None else environ
    engine = engine_mpi()
    explicit = environ.get("COLLECTIVES_MPIRUN")
    if explicit:
        path = explicit if os.sep in explicit else shutil.which(explicit, path=environ.get("PATH"))
        if not path or not os.path.isfile(path):
            raise LauncherError(f"MPI launcher not found: COLLECTIVES_MPIRUN={explicit} does not exist")
        if not os.access(path, os.X_OK):
            raise LauncherError(f"MPI launcher {path} (from COLLECTIVES_MPIRUN) is not executable")
        chosen = (path, "$COLLECTIVES_MPIRUN")
    else:
        candidates = _candidates(environ, engine)
        if not candidates:
            raise LauncherError("no MPI launcher (mpirun/mpiexec) found beside the engine's MPI, beside "
                                f"{sys.executable} or on PATH; install one (`pip install mpich`) or set "
                                "COLLECTIVES_MPIRUN to your MPI's mpirun")
        chosen = candidates[0]
    flavor, implementation, version = identify(chosen[0])
    launcher = MpiLauncher(chosen[0], flavor, implementation, version, chosen[1])
    warning = _mismatch_warning(flavor, engine)
    if warning:
        launcher.warnings.append(warning)
    if flavor == UNKNOWN:
        launcher.warnings.append(f"{chosen[0]} --version names neither MPICH/hydra nor Open MPI; launching with "
                                 "plain -np and the knobs in the environment")
    return launcher
