"""Runs inside the fresh virtual environment the binary wheel was installed into
(tests/project/test_wheel.py), on a PATH with no compiler.

    mpirun -np 2 python wheel_worker.py engine        an allreduce of several dtypes against numpy
    mpirun -np 2 python wheel_worker.py frameworks    the torch face's and the Keras face's
                                                      DistributedOptimizer against single-process steps

Each rank first checks that collectives, its engine and the MPI library it runs with are that
environment's (the wheel's and the mpich wheel's, not this checkout's or its .venv's), and that
mpi4py was not imported before collectives.init() (the loader loads it, and with it libmpi).
"""
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "0")
os.environ.setdefault("KERAS_BACKEND", "tensorflow")

import numpy as np  # noqa: E402
from common import Checker, rank_input  # noqa: E402

import collectives as hvd  # noqa: E402

PREFIX = os.path.realpath(sys.prefix)


def loaded_mpi_libraries():
    with open("/proc/self/maps") as f:
        return sorted({line.split()[-1] for line in f if "/libmpi" in line})


def check_installed_here():
    from collectives._loader import engine_module

    for module in (hvd, engine_module()):
        where = os.path.realpath(module.__file__)
        assert where.startswith(PREFIX + os.sep), f"{module.__name__} from {where}, not from {PREFIX}"
    expected = [os.path.join(PREFIX, "lib", "libmpi.so.12")]
    assert [os.path.realpath(p) for p in loaded_mpi_libraries()] == expected, loaded_mpi_libraries()


def check_allreduce(rank, size):
    for seed, dtype in enumerate((np.float32, np.float64, np.int32, np.int64)):
        got = hvd.allreduce(rank_input(seed, rank, (3, 5), dtype), op=hvd.Sum, name=f"wheel.sum.{seed}")
        expected = sum(rank_input(seed, r, (3, 5), dtype) for r in range(size))
        assert got.dtype == np.dtype(dtype), got.dtype
        np.testing.assert_array_equal(got, expected)
    got = hvd.allreduce(rank_input(9, rank, (1000,), np.float32), op=hvd.Average, name="wheel.average")
    expected = sum(rank_input(9, r, (1000,), np.float32).astype(np.float64) for r in range(size)) / size
    np.testing.assert_allclose(got, expected, rtol=1e-6)


def whole_batch(size, per_rank=4, features=5):
    rng = np.random.default_rng(7)
    x = rng.standard_normal((per_rank * size, features)).astype(np.float32)
    y = (x @ np.linspace(-1, 1, features).astype(np.float32))[:, None]
    return x, y, per_rank


def check_torch_face(rank, size):
    import torch

    import collectives.torch as thvd

    x, y, per_rank = whole_batch(size)
    mine = slice(rank * per_rank, (rank + 1) * per_rank)
    torch.manual_seed(0)
    model, reference = torch.nn.Linear(x.shape[1], 1), torch.nn.Linear(x.shape[1], 1)
    reference.load_state_dict(model.state_dict())
    start = [p.detach().numpy().copy() for p in model.parameters()]
    opt = thvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                    named_parameters=model.named_parameters())
    ref_opt = torch.optim.SGD(reference.parameters(), lr=0.1)
    for m, o, (bx, by) in ((model, opt, (x[mine], y[mine])), (reference, ref_opt, (x, y))):
        for _ in range(2):
            o.zero_grad()
            torch.nn.functional.mse_loss(m(torch.from_numpy(bx)), torch.from_numpy(by)).backward()
            o.step()
    for p, q, s in zip(model.parameters(), reference.parameters(), start):
        np.testing.assert_allclose(p.detach().numpy(), q.detach().numpy(), rtol=1e-5, atol=1e-6)
        assert not np.allclose(p.detach().numpy(), s), "the steps did not move the parameters"


def check_keras_face(rank, size):
    import keras

    import collectives.keras as khvd

    x, y, per_rank = whole_batch(size)
    mine = slice(rank * per_rank, (rank + 1) * per_rank)
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((x.shape[1],)), keras.layers.Dense(1)])
    reference = keras.models.clone_model(model)
    reference.set_weights(model.get_weights())
    start = model.get_weights()
    model.compile(optimizer=khvd.DistributedOptimizer(keras.optimizers.SGD(learning_rate=0.1)), loss="mse")
    reference.compile(optimizer=keras.optimizers.SGD(learning_rate=0.1), loss="mse")
    model.fit(x[mine], y[mine], batch_size=per_rank, epochs=2, shuffle=False, verbose=0)
    reference.fit(x, y, batch_size=per_rank * size, epochs=2, shuffle=False, verbose=0)
    for p, q, s in zip(model.get_weights(), reference.get_weights(), start):
        np.testing.assert_allclose(p, q, rtol=1e-5, atol=1e-6)
        assert not np.allclose(p, s), "the step did not move the weights"


def main():
    what = sys.argv[1]
    assert "mpi4py" not in sys.modules, "mpi4py was imported before collectives.init()"
    hvd.init()
    rank, size = hvd.rank(), hvd.size()
    checker = Checker(rank)
    checker.check("collectives, its engine and libmpi are this environment's", check_installed_here)
    if what == "engine":
        checker.check("allreduce against numpy", lambda: check_allreduce(rank, size))
    else:
        checker.check("torch face: DistributedOptimizer steps", lambda: check_torch_face(rank, size))
        checker.check("Keras face: DistributedOptimizer in fit", lambda: check_keras_face(rank, size))
    checker.finish()
    hvd.shutdown()


if __name__ == "__main__":
    main()
