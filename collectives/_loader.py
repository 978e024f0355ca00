"""Loads the compiled engine, making sure it shares the MPI library mpi4py uses.

The extension links libmpi by soname. Importing mpi4py.MPI first loads that library (and
initializes MPI with MPI_THREAD_MULTIPLE); the engine then binds to the same copy, so an
mpi4py communicator passed to ``init(comm)`` is valid inside the engine.
"""
_module = None


def engine_module():
    global _module
    if _module is None:
        from mpi4py import MPI  # noqa: F401  (loads and initializes libmpi)

        from . import _engine

        _module = _engine
    return _module
