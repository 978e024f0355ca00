"""Builds collectives._engine: C++17, linked against the MPI whose mpicc is found.

Which MPI: $COLLECTIVES_MPICC (path to an mpicc) if set, else the mpicc next to the running
Python (the pip `mpich` package in a virtual environment), else `mpicc` on PATH. No PyTorch
or TensorFlow headers are involved, and no CUDA toolkit is needed: the CUDA driver and NCCL
are loaded at run time when present.
"""
import concurrent.futures
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
    """Compile and link flags of an MPI compiler wrapper (MPICH: -show, Open MPI: --showme)."""
    for flag in ("-show", "--showme"):
        try:
            out = subprocess.run([mpicc, flag], capture_output=True, text=True, check=True).stdout
        except (OSError, subprocess.CalledProcessError):
            continue
        words = shlex.split(out)[1:]  # drop the underlying compiler
        flags = {"include_dirs": [], "library_dirs": [], "libraries": [], "extra_link_args": []}
        for w in words:
            if w.startswith("-I"):
                flags["include_dirs"].append(w[2:])
            elif w.startswith("-L"):
                flags["library_dirs"].append(w[2:])
                flags["extra_link_args"].append("-Wl,-rpath," + w[2:])
            elif w.startswith("-l"):
                flags["libraries"].append(w[2:])
            elif w.startswith("-Wl,") or w == "-pthread":
                flags["extra_link_args"].append(w)
        return flags
    sys.exit(f"collectives: `{mpicc} -show` / `--showme` did not work; is {mpicc} an MPI compiler wrapper?")


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
    text = open(ptx).read()
    with open(os.path.join(out_dir, "gpu_kernels_ptx.inc"), "w") as f:
        f.write('static const char kCollectivesPtx[] = R"collectives_ptx(' + text + ')collectives_ptx";\n')
    print(f"collectives: batched copy kernel compiled to PTX ({arch}) with {nvcc}")
    return out_dir


def compile_concurrently(compiler, jobs):
    """Makes ``compiler.compile`` compile its sources on ``jobs`` threads. setuptools' own
    ``parallel`` option builds several extensions at once, never the files of one, and the engine
    is one extension of some 60 files: one at a time, its build took 2:45 min on a 2-core VM."""
    serial = compiler.compile

    def compile(sources, output_dir=None, macros=None, include_dirs=None, debug=0, extra_preargs=None,
                extra_postargs=None, depends=None):
        if jobs < 2 or len(sources) < 2:
            return serial(sources, output_dir, macros, include_dirs, debug, extra_preargs, extra_postargs, depends)
        # The steps of CCompiler.compile (distutils' documented hooks for subclasses), with the
        # per-object step on a pool.
        macros, objects, extra_postargs, pp_opts, build = compiler._setup_compile(
            output_dir, macros, include_dirs, sources, depends, extra_postargs)
        cc_args = compiler._get_cc_args(pp_opts, debug, extra_preargs)

        def one(obj):
            if obj in build:  # else up to date
                src, ext = build[obj]
                compiler._compile(obj, src, ext, cc_args, extra_postargs, pp_opts)

        with concurrent.futures.ThreadPoolExecutor(jobs) as pool:
            list(pool.map(one, objects))  # list(): a failed compile raises here
        return objects

    compiler.compile = compile


class BuildEngine(build_ext):
    def build_extensions(self):
        import pybind11

        compile_concurrently(self.compiler, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity")
                             else os.cpu_count() or 1)

        mpicc = find_mpicc()
        flags = mpi_flags(mpicc)
        print(f"collectives: building against the MPI of {mpicc}")
        for ext in self.extensions:
            ext.include_dirs += [pybind11.get_include()] + flags["include_dirs"]
            ext.library_dirs += flags["library_dirs"]
            ext.libraries += flags["libraries"]
            ext.extra_link_args += flags["extra_link_args"]
            ptx_dir = build_ptx(self.build_temp)
            if ptx_dir:
                ext.include_dirs.append(ptx_dir)
                ext.define_macros.append(("COLLECTIVES_HAVE_PTX", "1"))
        super().build_extensions()


def engine_files(*suffixes):
    """The engine's files ending in one of `suffixes`, in every folder under csrc/ (the folders:
    docs/architecture-csrc.md), relative to this file and sorted: a new file needs no edit here.
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
    packages=["collectives", "collectives.elastic", "collectives.launcher", "collectives.torch", "collectives.tensorflow", "collectives.keras",
              "collectives.adapters", "collectives.adapters.torch", "collectives.adapters.tensorflow"],
    package_dir={"collectives": "collectives", "collectives.adapters": "adapters"},
)
