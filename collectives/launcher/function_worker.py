"""One rank of ``collectives.run``: ``python -m collectives.launcher.function_worker DIR``
loads the function from DIR, calls it and writes ``result.<rank>`` there: (OK, value, None)
or (ERROR, exception, traceback text)."""
import os
import sys
import traceback

import cloudpickle

PAYLOAD = "function.pkl"
OK = "ok"
ERROR = "error"


def result_path(directory, rank):
    return os.path.join(directory, f"result.{rank}")


def _launcher_rank():
    # The rank before (or without) collectives.init(): what MPICH's and Open MPI's launchers
    # tell each process.
    for var in ("PMI_RANK", "OMPI_COMM_WORLD_RANK", "PMIX_RANK"):
        if var in os.environ:
            return int(os.environ[var])
    return 0


def _write(directory, rank, outcome):
    tmp = result_path(directory, rank) + ".tmp"
    with open(tmp, "wb") as f:
        try:
            cloudpickle.dump(outcome, f)
        except Exception as e:  # noqa: BLE001 - an unpicklable value or exception
            f.seek(0)
            f.truncate()
            cloudpickle.dump((ERROR, RuntimeError(f"rank {rank}: the result cannot be pickled: {e}"), ""), f)
    os.replace(tmp, result_path(directory, rank))


def main(directory):
    rank = _launcher_rank()
    with open(os.path.join(directory, PAYLOAD), "rb") as f:
        func, args, kwargs = cloudpickle.load(f)
    try:
        value = func(*args, **kwargs)
    except BaseException as error:  # noqa: BLE001 - reported to the caller, with its traceback
        _write(directory, rank, (ERROR, error, traceback.format_exc()))
        return 1
    _write(directory, rank, (OK, value, None))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
