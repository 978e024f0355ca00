"""The host reductions' vector loops (csrc/host_math/local_reduce.h), which every host allreduce algorithm
of ours runs per chunk instead of MPI_Reduce_local: on the AVX2 path and the portable one, each
covered dtype/op gives numpy's result exactly (integers wrapping as two's complement), and the
same bits as MPICH's own operators (MPI_Reduce_local through mpi4py, in a process of its own);
the pairs not covered are left untouched, for MPI."""
import os
import subprocess
import sys

import numpy as np
import pytest

from collectives._loader import engine_module

# The engine's DataType and ReduceOp numbers (csrc/common/types.h).
DTYPES = {0: np.uint8, 1: np.int8, 2: np.int16, 3: np.int32, 4: np.int64, 7: np.float32, 8: np.float64}
AVERAGE, SUM, MIN, MAX, PRODUCT = 0, 1, 3, 4, 5
INTEGER = [0, 1, 2, 3, 4]


def _inputs(np_dtype, n, seed):
    """Integers over their whole range (so Sum and Product overflow), floats of mixed magnitude
    and sign with zeros, infinities and NaN."""
    rng = np.random.default_rng(seed)
    dt = np.dtype(np_dtype)
    if dt.kind in "iu":
        info = np.iinfo(dt)
        return rng.integers(info.min, info.max, size=n, dtype=dt, endpoint=True)
    x = (rng.standard_normal(n) * 10.0 ** rng.integers(-30, 30, size=n)).astype(dt)
    special = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 1.0], dt)
    x[:min(n, len(special))] = special[:n]
    return x


@np.errstate(all="ignore")
def _reference(op, a, b):
    if op in (SUM, AVERAGE):
        return a + b
    if op == PRODUCT:
        return a * b
    return np.minimum(a, b) if op == MIN else np.maximum(a, b)


def _same_bits(got, want):
    assert got.tobytes() == want.tobytes(), (got[got != want][:5], want[got != want][:5])


@pytest.mark.parametrize("portable", [False, True], ids=["vector", "portable"])
@pytest.mark.parametrize("dtype", sorted(DTYPES), ids=[np.dtype(DTYPES[d]).name for d in sorted(DTYPES)])
@pytest.mark.parametrize("op", [AVERAGE, SUM, PRODUCT, MIN, MAX], ids=["average", "sum", "product", "min", "max"])
@pytest.mark.parametrize("n", [1, 7, 33, 4099])
def test_covered_pairs_match_numpy_exactly(portable, dtype, op, n):
    np_dtype = DTYPES[dtype]
    a, b = _inputs(np_dtype, n, 1), _inputs(np_dtype, n, 2)
    out = b.copy()
    path = engine_module().local_reduce_for_testing(dtype, op, a, out, portable)
    if op in (MIN, MAX) and dtype not in INTEGER:
        assert path is None  # float Min/Max: MPI's operators (NaN handling is theirs)
        _same_bits(out, b)
        return
    assert path == ("portable" if portable else path) and path in ("avx2", "portable")
    _same_bits(out, _reference(op, a, b))


def test_uncovered_pairs_are_left_to_mpi():
    for dtype, np_dtype in ((5, np.float16), (6, np.uint16), (9, np.bool_)):
        a = np.ones(8, np_dtype)
        out = a.copy()
        assert engine_module().local_reduce_for_testing(dtype, SUM, a, out, False) is None
        _same_bits(out, a)


def test_this_cpu_uses_avx2_when_it_has_it():
    flags = open("/proc/cpuinfo").read().split() if os.path.exists("/proc/cpuinfo") else []
    path = engine_module().local_reduce_for_testing(7, SUM, np.zeros(1, np.float32), np.zeros(1, np.float32), False)
    assert (path == "avx2") == ("avx2" in flags)


MPI_CHECK = r"""
import numpy as np
from mpi4py import MPI
from collectives._loader import engine_module
import test_local_reduce as t
ops = {t.SUM: MPI.SUM, t.AVERAGE: MPI.SUM, t.PRODUCT: MPI.PROD, t.MIN: MPI.MIN, t.MAX: MPI.MAX}
checked = 0
for dtype, np_dtype in t.DTYPES.items():
    for op, mpi_op in ops.items():
        if op in (t.MIN, t.MAX) and dtype not in t.INTEGER:
            continue
        for portable in (False, True):
            a, b = t._inputs(np_dtype, 1031, 3), t._inputs(np_dtype, 1031, 4)
            ours, theirs = b.copy(), b.copy()
            assert engine_module().local_reduce_for_testing(dtype, op, a, ours, portable) is not None
            mpi_op.Reduce_local(a, theirs)
            t._same_bits(ours, theirs)
            checked += 1
print("checked", checked)
"""


def test_same_bits_as_mpichs_operators():
    """Against MPI_Reduce_local itself, in a process of its own (mpi4py initializes MPI)."""
    here = os.path.dirname(os.path.abspath(__file__))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [here, os.environ.get("PYTHONPATH")])))
    out = subprocess.run([sys.executable, "-c", MPI_CHECK], capture_output=True, text=True, timeout=120, env=env)
    assert out.returncode == 0, out.stdout + out.stderr
    assert out.stdout.split()[-1] == str(len(DTYPES) * 3 * 2 + len(INTEGER) * 2 * 2), out.stdout
