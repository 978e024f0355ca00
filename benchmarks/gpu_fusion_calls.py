"""How many NCCL calls a burst of GPU allreduces becomes, with no GPU: ResNet-50's 161 gradient
shapes, each submitted with allreduce_async_ and then synchronized, through the stand-in CUDA
driver and NCCL of tests/gpu/fakes (one rank), which count the calls. FAKE_CUDA_EVENT_US makes
each collective take that long on the stand-in "GPU"; COLLECTIVES_GPU_FUSION_WAIT=0 turns off
the engine's wait for a busy GPU, and COLLECTIVES_GPU_FUSION_WAIT_MS bounds it (docs/gpus.md,
Fusion).

    mkdir -p /tmp/fk && for f in cuda:libcuda.so.1 nccl:libnccl.so.2; do
      cc -shared -fPIC -O1 -Icsrc -o /tmp/fk/${f#*:} tests/gpu/fakes/fake_${f%%:*}.c -Wl,-soname,${f#*:}; done
    LD_LIBRARY_PATH=/tmp/fk COLLECTIVES_NCCL_LIBRARY=/tmp/fk/libnccl.so.2 FAKE_CUDA_EVENT_US=100 \\
      .venv/bin/mpirun -np 1 .venv/bin/python benchmarks/gpu_fusion_calls.py [--rounds 3]

Times here are host copies and mean nothing for a GPU; the count of NCCL calls is the point.
"""
import argparse
import ctypes
import os
import sys
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
TESTS = os.path.join(os.path.dirname(HERE), "tests")
sys.path[:0] = [os.path.join(TESTS, "gpu", "workers"), os.path.join(TESTS, "support")]

import collectives as hvd  # noqa: E402
from allreduce_bench import RESNET50  # noqa: E402
from collectives._loader import engine_module  # noqa: E402
from gpu_fake_worker import FakeGpuArray  # noqa: E402


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    hvd.init()
    info = engine_module().gpu_info()
    nccl = ctypes.CDLL(info["nccl_path"]) if info["available"] else None
    if nccl is None or not hasattr(nccl, "fake_nccl_count"):
        sys.exit(f"needs the stand-in libraries (see the docstring); loaded: {info}")
    nccl.fake_nccl_count.argtypes = [ctypes.c_char_p]
    grads = [FakeGpuArray(np.ones(s, np.float32)) for s in RESNET50]
    print(f"{len(grads)} gradients; FAKE_CUDA_EVENT_US={os.environ.get('FAKE_CUDA_EVENT_US', '0')}, "
          f"COLLECTIVES_GPU_FUSION_WAIT={os.environ.get('COLLECTIVES_GPU_FUSION_WAIT', '1')}")
    for r in range(args.rounds):
        before = nccl.fake_nccl_count(b"allreduce")
        start = time.perf_counter()
        handles = [hvd.allreduce_async_(g, op=hvd.Average, name=f"grad.{i}") for i, g in enumerate(grads)]
        for h in handles:
            hvd.synchronize(h)
        print(f"round {r}: {nccl.fake_nccl_count(b'allreduce') - before} NCCL calls "
              f"({(time.perf_counter() - start) * 1e3:.1f} ms)")
    hvd.shutdown()


if __name__ == "__main__":
    main()
