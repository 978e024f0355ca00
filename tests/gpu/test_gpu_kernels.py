"""The batched copy kernel (csrc/gpu/gpu_kernels.cu) without a GPU: its per-thread work
(csrc/gpu/gpu_copy_batch.h) run on the CPU over whole grids against memcpy; the kernel compiled
to PTX and assembled for Hopper when a CUDA toolkit is here. Its use by the engine is tested
through the stand-in driver (tests/gpu/test_gpu_loader.py) and on a GPU by tests/gpu/test_gpu.py."""
import os
import shutil
import subprocess

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
CSRC = os.path.join(os.path.dirname(os.path.dirname(HERE)), "csrc")
CC = shutil.which("cc") or shutil.which("gcc")
NVCC = shutil.which("nvcc") or ("/usr/local/cuda/bin/nvcc" if os.path.exists("/usr/local/cuda/bin/nvcc") else None)


@pytest.mark.skipif(CC is None, reason="no C compiler")
def test_copy_work_on_the_cpu(tmp_path):
    exe = tmp_path / "gpu_kernel_check"
    subprocess.run([CC, "-O1", "-Wall", f"-I{CSRC}", os.path.join(HERE, "gpu_kernel_check.c"), "-o", str(exe)],
                   check=True, timeout=120)
    proc = subprocess.run([str(exe)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and "0 wrong copies" in proc.stdout, proc.stdout + proc.stderr


@pytest.mark.skipif(NVCC is None, reason="no nvcc (a CUDA toolkit builds the kernel's PTX)")
def test_kernel_compiles_to_ptx_that_assembles_for_hopper(tmp_path):
    ptx = tmp_path / "k.ptx"
    archs = subprocess.run([NVCC, "--list-gpu-arch"], capture_output=True, text=True, timeout=60).stdout.split()
    arch = next((a for a in archs if a.startswith("compute_")), "compute_75")
    subprocess.run([NVCC, "-ptx", f"-arch={arch}", "-O3", f"-I{CSRC}", os.path.join(CSRC, "gpu", "gpu_kernels.cu"), "-o",
                    str(ptx)], check=True, timeout=300)
    text = ptx.read_text()
    assert ".entry collectives_batched_copy(" in text
    ptxas = os.path.join(os.path.dirname(os.path.realpath(NVCC)), "ptxas")
    if not os.path.exists(ptxas):
        pytest.skip("no ptxas beside nvcc")
    proc = subprocess.run([ptxas, "-arch=sm_90", "-v", str(ptx), "-o", str(tmp_path / "k.cubin")],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert "0 bytes spill" in proc.stdout + proc.stderr, proc.stdout + proc.stderr
