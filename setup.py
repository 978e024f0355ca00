"""Builds collectives._engine: C++17, linked against the MPI whose mpicc is found.

Which MPI: $COLLECTIVES_MPICC (path to an mpicc) if set, else the mpicc next to the running
Python (the pip `mpich` package in a virtual environment), else `mpicc` on PATH. No PyTorch
or TensorFlow headers are involved, and no CUDA toolkit is needed: the CUDA driver and NCCL
are loaded at run time when present.
"""
import concurrent.futures
import glob
import os
import shlex
import shutil
import subprocess
import sys

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

HERE = os.path.dirname(os.path.abspath(__file__))


def find_mpicc():
    explicit = os.environ.get("COLLECTIVES_MPICC")
    if explicit:
        return explicit
    beside_python = os.path.join(os.path.dirname(sys.executable), "mpicc")
    if os.path.exists(beside_python):
        return beside_python
    found = shutil.which("mpicc")
    if found:
        return found
    sys.exit(
        "collectives: no mpicc found. Install the MPICH wheel (`pip install mpich`) into this "
        "environment, or set COLLECTIVES_MPICC to the mpicc of your MPI."
    )


def mpi_flags(mpicc):
    """Compile and link flags of an MPI compiler wrapper (MPICH: -show, Open MPI: --showme).
    Its run-time search paths (-Wl,-rpath and the -L directories) come apart, in
    "runtime_dirs": where the built engine looks for libmpi is decided by runtime_library_dirs."""
    for flag in ("-show", "--showme"):
        try:
            out = subprocess.run([mpicc, flag], capture_output=True, text=True, check=True).stdout
        except (OSError, subprocess.CalledProcessError):
            continue
        words = shlex.split(out)[1:]  # drop the underlying compiler
        flags = {"include_dirs": [], "library_dirs": [], "libraries": [], "extra_link_args": [], "runtime_dirs": []}
        rpath_next = False  # MPICH writes "-Wl,-rpath -Wl,DIR": the directory is the next word
        for w in words:
            if rpath_next and w.startswith("-Wl,"):
                flags["runtime_dirs"].append(w[4:])
                rpath_next = False
            elif w.startswith("-I"):
                flags["include_dirs"].append(w[2:])
            elif w.startswith("-L"):
                flags["library_dirs"].append(w[2:])
                flags["runtime_dirs"].append(w[2:])
            elif w.startswith("-l"):
                flags["libraries"].append(w[2:])
            elif w.startswith("-Wl,"):
                parts = w[4:].split(",")
                if parts[0] in ("-rpath", "-R", "--rpath"):
                    flags["runtime_dirs"] += parts[1:]
                    rpath_next = len(parts) == 1
                elif parts[0].startswith(("-rpath=", "--rpath=")):
                    flags["runtime_dirs"].append(parts[0].split("=", 1)[1])
                else:
                    flags["extra_link_args"].append(w)
            elif w == "-pthread":
                flags["extra_link_args"].append(w)
        return flags
    sys.exit(f"collectives: `{mpicc} -show` / `--showme` did not work; is {mpicc} an MPI compiler wrapper?")


def mpich_wheel_site_packages(libdir):
    """The site-packages beside the `mpich` wheel whose libmpi.so.12 is in ``libdir`` (pip puts
    the wheel's libraries in <prefix>/lib, its metadata in <prefix>/lib/pythonX.Y/site-packages),
    else None: another MPI. Found by layout, not by importlib.metadata, because pip's isolated
    build environment hides the target environment's packages while its mpicc may be used."""
    if not os.path.exists(os.path.join(libdir, "libmpi.so.12")):
        return None
    found = glob.glob(os.path.join(libdir, "python*", "*-packages", "mpich-*.dist-info"))
    return os.path.dirname(found[0]) if found else None


def runtime_library_dirs(flags, in_tree):
    """Where the engine looks for libmpi at run time (its RUNPATH).

    The `mpich` wheel (the usual case, and the wheel's build): its libmpi lies at a fixed place
    relative to the engine once pip has installed both into one environment, so the path is
    relative to $ORIGIN and names no directory of this build: pip builds in an isolated
    environment it deletes afterwards, and a wheel is installed elsewhere. An engine built into
    the checkout (``in_tree``: the editable install, scripts/build_engine.sh, gpu-check.sh's)
    runs with the MPICH it was built against, and $ORIGIN means nothing there: that MPICH's lib
    directory is added. Another MPI ($COLLECTIVES_MPICC): its own library directories, as its
    mpicc says. Either way
    collectives._loader imports mpi4py first, which loads the MPI library, and the engine binds
    to that copy by its soname."""
    for libdir in flags["library_dirs"]:
        site_packages = mpich_wheel_site_packages(libdir)
        if site_packages:
            relative = "$ORIGIN/" + os.path.relpath(libdir, os.path.join(site_packages, "collectives"))
            return [relative, libdir] if in_tree else [relative]
    return list(dict.fromkeys(flags["runtime_dirs"]))


def build_ptx(build_temp):
    """csrc/gpu/gpu_kernels.cu as PTX text in a header (gpu_kernels_ptx.inc) when a CUDA compiler is
    here ($COLLECTIVES_NVCC, else nvcc on PATH or in /usr/local/cuda; "none": skip). The engine
    loads it through the driver at run time, so the built extension needs no CUDA toolkit;
    without it the engine copies with cuMemcpyDtoDAsync. Returns the header's directory or None."""
    nvcc = os.environ.get("COLLECTIVES_NVCC") or shutil.which("nvcc") or "/usr/local/cuda/bin/nvcc"
    if nvcc == "none" or not os.path.exists(nvcc) and not shutil.which(nvcc):
        print("collectives: no nvcc, building without the batched copy kernel")
        return None
    out_dir = os.path.join(build_temp, "generated")
    os.makedirs(out_dir, exist_ok=True)
    ptx = os.path.join(out_dir, "gpu_kernels.ptx")
    try:
        # The oldest virtual architecture this nvcc knows: the driver compiles PTX for newer GPUs.
        archs = subprocess.run([nvcc, "--list-gpu-arch"], capture_output=True, text=True, timeout=60).stdout.split()
        arch = next((a for a in archs if a.startswith("compute_")), "compute_75")
        subprocess.run([nvcc, "-ptx", f"-arch={arch}", "-O3", "-I" + os.path.join(HERE, "csrc"),
                        os.path.join(HERE, "csrc", "gpu", "gpu_kernels.cu"), "-o", ptx],
                       check=True, capture_output=True, text=True, timeout=300)
    except (OSError, subprocess.SubprocessError) as e:
        print(f"collectives: nvcc failed ({e}), building without the batched copy kernel")
        return None
    header = 'static const char kCollectivesPtx[] = R"collectives_ptx(' + open(ptx).read() + ')collectives_ptx";\n'
    inc = os.path.join(out_dir, "gpu_kernels_ptx.inc")
    if not os.path.exists(inc) or open(inc).read() != header:  # unchanged: its objects stay up to date
        with open(inc, "w") as f:
            f.write(header)
    print(f"collectives: batched copy kernel compiled to PTX ({arch}) with {nvcc}")
    return out_dir


def newest_mtime(paths):
    return max((os.path.getmtime(p) for p in paths if os.path.exists(p)), default=0.0)


def compile_concurrently(compiler, jobs):
    """Makes ``compiler.compile`` compile its sources on ``jobs`` threads, and only those whose
    object is missing or older than the source or any header. setuptools' own ``parallel``
    option builds several extensions at once, never the files of one, and the engine is one
    extension of some 60 files: one at a time, its build took 2:45 min on a 2-core VM.

    Objects are reused only when made with the same command line: a stamp file beside them
    holds it, and any difference (another Python, pybind11 or MPI, the PTX define) compiles
    everything. So the wheel's build (scripts/build_wheel.sh) reuses what the editable install
    compiled, and scripts/build_engine.sh recompiles what a change touched."""
    def compile(sources, output_dir=None, macros=None, include_dirs=None, debug=0, extra_preargs=None,
                extra_postargs=None, depends=None):
        # The steps of CCompiler.compile (distutils' documented hooks for subclasses), with the
        # per-object step on a pool.
        macros, objects, extra_postargs, pp_opts, build = compiler._setup_compile(
            output_dir, macros, include_dirs, sources, depends, extra_postargs)
        cc_args = compiler._get_cc_args(pp_opts, debug, extra_preargs)
        stamp = os.path.join(output_dir or ".", "engine-command-line.txt")
        command_line = repr((compiler.compiler_so, getattr(compiler, "compiler_so_cxx", None), cc_args,
                             extra_postargs)) + "\n"
        reuse = False
        if os.path.exists(stamp):
            with open(stamp) as f:
                reuse = f.read() == command_line
        if not reuse and os.path.exists(stamp):
            os.remove(stamp)  # until every object is made with the new command line
        headers_changed = newest_mtime(depends or [])

        def stale(obj):
            src = build[obj][0]
            return not (reuse and os.path.exists(obj)
                        and os.path.getmtime(obj) >= max(os.path.getmtime(src), headers_changed))

        todo = [obj for obj in objects if obj in build and stale(obj)]

        def one(obj):
            src, ext = build[obj]
            compiler._compile(obj, src, ext, cc_args, extra_postargs, pp_opts)

        if todo:
            threads = min(jobs, len(todo))
            print(f"collectives: compiling {len(todo)} of {len(objects)} engine sources on {threads} threads")
        with concurrent.futures.ThreadPoolExecutor(max(1, jobs)) as pool:
            list(pool.map(one, todo))  # list(): a failed compile raises here
        with open(stamp, "w") as f:
            f.write(command_line)
        return objects

    compiler.compile = compile


class BuildEngine(build_ext):
    def build_extensions(self):
        import pybind11

        # One place for the engine's objects, whichever command builds (editable install, wheel,
        # scripts/build_engine.sh): compile_concurrently reuses those still up to date. A wheel
        # for another Python (scripts/build_wheel.sh with PYTHON=...) keeps its objects apart, so
        # neither build recompiles the other's each time.
        self.build_temp = os.environ.get("COLLECTIVES_BUILD_TEMP") or os.path.join(HERE, "build", "temp")

        compile_concurrently(self.compiler, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity")
                             else os.cpu_count() or 1)

        mpicc = find_mpicc()
        flags = mpi_flags(mpicc)
        # The engine lands in the checkout: an editable install, or scripts/build_engine.sh.
        in_tree = self.inplace or getattr(self, "editable_mode", False) or os.environ.get("COLLECTIVES_IN_TREE") == "1"
        print(f"collectives: building against the MPI of {mpicc}")
        for ext in self.extensions:
            ext.include_dirs += [pybind11.get_include()] + flags["include_dirs"]
            ext.library_dirs += flags["library_dirs"]
            ext.libraries += flags["libraries"]
            ext.extra_link_args += flags["extra_link_args"]
            ext.runtime_library_dirs += runtime_library_dirs(flags, in_tree)
            ptx_dir = build_ptx(self.build_temp)
            if ptx_dir:
                ext.include_dirs.append(ptx_dir)
                ext.depends.append(os.path.join(ptx_dir, "gpu_kernels_ptx.inc"))
                ext.define_macros.append(("COLLECTIVES_HAVE_PTX", "1"))
        super().build_extensions()


def engine_files(*suffixes):
    """The engine's files ending in one of `suffixes`, in every folder under csrc/ (the folders:
    docs/architecture.md), relative to this file and sorted: a new file needs no edit here.
    gpu/gpu_kernels.cu is no C++ source: build_ptx compiles it to PTX."""
    found = []
    for root, _, names in os.walk(os.path.join(HERE, "csrc")):
        found += [os.path.relpath(os.path.join(root, n), HERE) for n in names if n.endswith(suffixes)]
    return sorted(found)


engine = Extension(
    "collectives._engine",
    sources=engine_files(".cc"),
    depends=engine_files(".h", ".cu", ".map"),
    include_dirs=["csrc"],  # includes name their path from csrc/: #include "negotiation/negotiator.h"
    language="c++",
    libraries=["dl"],  # the CUDA driver and NCCL are dlopen'ed at run time (csrc/gpu/gpu_loader.cc)
    # -g0: Python's own flags carry -g, which makes the build about a third slower and the
    # extension 17 times larger (bindings.cc: 40 s and 17 MB against 25 s and 0.9 MB on a 2-core VM).
    extra_compile_args=["-std=c++17", "-O3", "-g0", "-fvisibility=hidden", "-Wall", "-Wno-unused-function"],
    # Exports PyInit__engine alone (csrc/python/engine_exports.map says why).
    extra_link_args=["-Wl,--version-script=" + os.path.join(HERE, "csrc", "python", "engine_exports.map")],
)

setup(
    ext_modules=[engine],
    cmdclass={"build_ext": BuildEngine},
    packages=["collectives", "collectives.elastic", "collectives.launcher", "collectives.ray", "collectives.torch", "collectives.tensorflow", "collectives.keras",
              "collectives.adapters", "collectives.adapters.torch", "collectives.adapters.tensorflow"],
    package_dir={"collectives": "collectives", "collectives.adapters": "adapters"},
)
