"""Grouped allreduce of a small model's gradients: collectives against raw mpi4py, in a loop.

    .venv/bin/mpirun -np 2 .venv/bin/python benchmarks/grouped_bench.py [--model cnn] [--rounds 40]

The arrays are the parameter shapes of benchmarks/small_models.py's model (float32), one numpy
array each, reduced with op Average. Variants:
  sync     collectives.grouped_allreduce_(arrays): the synchronous verb
  async    collectives.grouped_allreduce_async_(arrays), then synchronize: what the torch
           DistributedOptimizer does in step() for a model under COLLECTIVES_OVERLAP_MIN_BYTES
  raw      raw mpi4py as a user would write it: the arrays copied into one flat buffer,
           Allreduce(IN_PLACE), divided by the size, copied back
  raw_flat the Allreduce(IN_PLACE) of the flat buffer alone (no copies, no division)

Method: first each variant's result is checked against numpy's average of every rank's
inputs (a wrong one exits non-zero). Then each round runs every variant for --calls calls after
a barrier (the order rotating between rounds); a round's figure is the mean time per call on
the slower rank. Reported: the median over rounds with its quartiles, and each variant's ratio
to raw.
"""
import argparse
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import numpy as np  # noqa: E402
from mpi4py import MPI  # noqa: E402

import collectives as hvd  # noqa: E402
from machine_info import describe_load, describe_machine, load_average, rotated, utc_now  # noqa: E402


def parameter_shapes(model_name):
    """The model's parameter shapes, without building it in torch."""
    if model_name == "cnn":  # conv(1->32, 3x3), conv(32->64, 3x3), fc(1600->10)
        return [(32, 1, 3, 3), (32,), (64, 32, 3, 3), (64,), (10, 1600), (10,)]
    return [(1024, 784), (1024,), (1024, 1024), (1024,), (10, 1024), (10,)]  # mlp 784-1024-1024-10


def variants(arrays, comm):
    flat = np.zeros(sum(a.size for a in arrays), np.float32)
    size = comm.Get_size()

    def sync():
        hvd.grouped_allreduce_(arrays, op=hvd.Average, name="grouped_bench.sync")

    def async_then_wait():
        hvd.synchronize(hvd.grouped_allreduce_async_(arrays, op=hvd.Average, name="grouped_bench.async"))

    def raw():
        np.concatenate([a.reshape(-1) for a in arrays], out=flat)
        comm.Allreduce(MPI.IN_PLACE, flat, op=MPI.SUM)
        np.divide(flat, size, out=flat)
        offset = 0
        for a in arrays:
            a.reshape(-1)[...] = flat[offset:offset + a.size]
            offset += a.size

    def raw_flat():
        comm.Allreduce(MPI.IN_PLACE, flat, op=MPI.SUM)

    return {"sync": sync, "async": async_then_wait, "raw": raw, "raw_flat": raw_flat}


def inputs(model_name, rank):
    rng = np.random.default_rng(rank)
    return [rng.standard_normal(shape).astype(np.float32) for shape in parameter_shapes(model_name)]


def check_results(fns, arrays, model_name, comm):
    """Each variant that writes the arrays leaves numpy's average of every rank's inputs there
    (computed here from every rank's seed); exits non-zero otherwise."""
    mine = inputs(model_name, comm.Get_rank())
    every = [inputs(model_name, r) for r in range(comm.Get_size())]
    expected = [np.mean([e[i].astype(np.float64) for e in every], axis=0) for i in range(len(mine))]
    for name in ("sync", "async", "raw"):
        for a, m in zip(arrays, mine):
            a[...] = m
        fns[name]()
        for i, (a, e) in enumerate(zip(arrays, expected)):
            if not np.allclose(a, e, rtol=1e-5, atol=1e-6):
                sys.exit(f"rank {comm.Get_rank()}: {name} array {i} differs from numpy's average")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="cnn", choices=["cnn", "mlp"])
    parser.add_argument("--rounds", type=int, default=40)
    parser.add_argument("--calls", type=int, default=20)
    args = parser.parse_args()
    hvd.init()
    comm = MPI.COMM_WORLD
    rank0 = comm.Get_rank() == 0
    loads_start = load_average()
    arrays = inputs(args.model, comm.Get_rank())
    fns = variants(arrays, comm)
    check_results(fns, arrays, args.model, comm)
    names = list(fns)
    for fn in fns.values():
        for _ in range(args.calls):
            fn()
    times = {name: [] for name in names}
    for _, name in rotated(names, args.rounds):
        comm.Barrier()
        start = time.perf_counter()
        for _ in range(args.calls):
            fns[name]()
        times[name].append((time.perf_counter() - start) / args.calls * 1e6)
    slowest = {name: np.max(comm.allgather(times[name]), axis=0) for name in names}
    if not rank0:
        return
    nbytes = sum(a.nbytes for a in arrays)
    print(f"grouped allreduce benchmark: {describe_machine()}; {utc_now()}")
    print(f"{args.model}: {len(arrays)} arrays, {nbytes} bytes; {comm.Get_size()} ranks; "
          f"{args.rounds} rounds x {args.calls} calls")
    raw = np.median(slowest["raw"])
    for name in names:
        q1, q2, q3 = np.percentile(slowest[name], [25, 50, 75])
        print(f"  {name:9s} {q2:8.1f} us per call ({q1:.1f} to {q3:.1f})   {q2 / raw:5.2f}x raw")
    print(f"load at start: {describe_load(loads_start)}")
    print(f"load at end:   {describe_load(load_average())}")


if __name__ == "__main__":
    main()
