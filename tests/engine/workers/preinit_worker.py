"""Every public entry point before init(): run as a plain process (no mpirun).

Prints one JSON object: {call: [exception class names of the MRO, message] or "ok"}, plus
whether importing collectives loaded MPI.
"""
import json
import sys

import numpy as np

import collectives as hvd

x = np.ones(4, np.float32)

CALLS = {
    "rank": lambda: hvd.rank(),
    "size": lambda: hvd.size(),
    "local_rank": lambda: hvd.local_rank(),
    "local_size": lambda: hvd.local_size(),
    "cross_rank": lambda: hvd.cross_rank(),
    "cross_size": lambda: hvd.cross_size(),
    "allreduce": lambda: hvd.allreduce(x, name="pre.a"),
    "allreduce_async": lambda: hvd.allreduce_async(x, name="pre.b"),
    "allreduce_": lambda: hvd.allreduce_(x.copy(), name="pre.c"),
    "allreduce_async_": lambda: hvd.allreduce_async_(x.copy(), name="pre.d"),
    "grouped_allreduce": lambda: hvd.grouped_allreduce([x, x], name="pre.e"),
    "grouped_allreduce_async": lambda: hvd.grouped_allreduce_async([x, x], name="pre.e2"),
    "broadcast": lambda: hvd.broadcast(x, 0, name="pre.f"),
    "broadcast_": lambda: hvd.broadcast_(x.copy(), 0, name="pre.g"),
    "broadcast_async": lambda: hvd.broadcast_async(x, 0, name="pre.h"),
    "allgather": lambda: hvd.allgather(x, name="pre.i"),
    "allgather_async": lambda: hvd.allgather_async(x, name="pre.j"),
    "grouped_allgather": lambda: hvd.grouped_allgather([x], name="pre.j2"),
    "alltoall": lambda: hvd.alltoall(x, name="pre.k"),
    "alltoall_async": lambda: hvd.alltoall_async(x, name="pre.l"),
    "reducescatter": lambda: hvd.reducescatter(x, name="pre.m"),
    "reducescatter_async": lambda: hvd.reducescatter_async(x, name="pre.n"),
    "grouped_reducescatter": lambda: hvd.grouped_reducescatter([x], name="pre.n2"),
    "barrier": lambda: hvd.barrier(),
    "broadcast_object": lambda: hvd.broadcast_object({"a": 1}, 0),
    "allgather_object": lambda: hvd.allgather_object({"a": 1}),
    "start_timeline": lambda: hvd.start_timeline("/dev/null"),
    "stop_timeline": lambda: hvd.stop_timeline(),
    "unnamed_allreduce": lambda: hvd.allreduce(x),
}


def main():
    results = {"mpi_loaded_by_import": "mpi4py.MPI" in sys.modules}
    results["is_initialized"] = hvd.is_initialized()
    for name, call in CALLS.items():
        try:
            call()
        except BaseException as e:  # noqa: BLE001 - every outcome is reported
            results[name] = [[c.__name__ for c in type(e).__mro__], str(e)]
        else:
            results[name] = "ok"
    # shutdown() before init is harmless (Horovod allows it).
    try:
        hvd.shutdown()
        results["shutdown"] = "ok"
    except BaseException as e:  # noqa: BLE001
        results["shutdown"] = [[c.__name__ for c in type(e).__mro__], str(e)]
    results["is_initialized_after"] = hvd.is_initialized()
    # Last, because it imports mpi4py.MPI before finding the engine missing.
    try:
        hvd.mpi_threads_supported()
        results["mpi_threads_supported"] = "ok"
    except BaseException as e:  # noqa: BLE001
        results["mpi_threads_supported"] = [[c.__name__ for c in type(e).__mro__], str(e)]
    print(json.dumps(results))


if __name__ == "__main__":
    main()
