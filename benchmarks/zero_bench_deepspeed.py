"""DeepSpeed ZeRO stages 1 and 2 on CPU, on benchmarks/zero_bench.py's model (the peer row of its
table, docs/zero.md). DeepSpeed does not go into our virtual environment (it pins its own
dependencies), so this runs from a separate one that sees ours:

    python3 -m venv /tmp/ds
    echo "$PWD/.venv/lib/python3.11/site-packages" > /tmp/ds/lib/python3.11/site-packages/our.pth
    /tmp/ds/bin/python -m pip install --no-build-isolation deepspeed
    DS_ACCELERATOR=cpu LD_LIBRARY_PATH=$PWD/.venv/lib OMP_NUM_THREADS=1 \\
        .venv/bin/mpirun -np 2 /tmp/ds/bin/python benchmarks/zero_bench_deepspeed.py [--rounds 3 --steps 3]

(``LD_LIBRARY_PATH``: mpi4py, which DeepSpeed uses to find its rank, looks for MPICH's library
beside the running Python.) The first run JIT-compiles DeepSpeed's shared-memory communication op
(minutes on a busy 2-core machine; ``TORCH_EXTENSIONS_DIR`` keeps it). Not interleaved with
zero_bench.py's variants (another process, another environment): compare under the same load.
"""
import argparse
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from zero_bench import mlp  # noqa: E402


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--params", type=float, default=25e6)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--steps", type=int, default=3)
    args = p.parse_args()
    torch.set_num_threads(1)
    import deepspeed
    import torch.distributed as dist
    deepspeed.init_distributed(dist_backend="gloo", auto_mpi_discovery=True)
    for stage in (1, 2):
        torch.manual_seed(0)
        model, width = mlp(args.params, torch)
        config = {"train_micro_batch_size_per_gpu": args.batch, "zero_optimization": {"stage": stage},
                  "optimizer": {"type": "Adam", "params": {"lr": 1e-4, "torch_adam": True}}}
        engine, opt, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=config)
        x = torch.randn(args.batch, width)
        times = []
        for i in range(1 + args.rounds * args.steps):  # the first: warm-up
            dist.barrier()
            t0 = time.perf_counter()
            engine.backward(engine(x).pow(2).mean())
            engine.step()
            t = torch.tensor([time.perf_counter() - t0])
            dist.all_reduce(t, op=dist.ReduceOp.MAX)  # the slowest rank's step
            if i:
                times.append(t.item())
        state = sum(v.numel() * v.element_size() for st in opt.state.values() for v in st.values()
                    if torch.is_tensor(v))
        if dist.get_rank() == 0:
            print(f"| DeepSpeed ZeRO {stage} | {statistics.median(times) * 1e3:.1f} ms | optimizer state on rank 0: "
                  f"{state / 2 ** 20:.1f} MiB | load {os.getloadavg()[0]:.1f} |", flush=True)


if __name__ == "__main__":
    main()
