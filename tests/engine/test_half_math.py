"""float16/bfloat16 arithmetic of the engine (the MPI reductions' user operations and the
Average/scale-factor scaling) on both the CPU's vector path (F16C for float16, AVX2 for
bfloat16, chosen at run time) and the portable loop: each must give numpy's result, computed
in float32 and rounded to nearest even, bit for bit (NaNs compared as NaNs)."""
import ml_dtypes
import numpy as np
import pytest

from collectives._loader import engine_module

BF16 = np.dtype(ml_dtypes.bfloat16)
OPS = {0: np.add, 1: np.minimum, 2: np.maximum, 3: np.multiply}


def _inputs(dtype, n, seed):
    """Values across the whole range: normals, subnormals, zeros of both signs, infinities,
    NaN, and sizes that leave a tail after the 8-wide vector loop."""
    rng = np.random.default_rng(seed)
    bits = rng.integers(0, 2 ** 16, size=n, dtype=np.uint16)
    x = bits.view(dtype).astype(np.float32)
    special = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 1e-7, -3e-6, 65504.0, 1.0, -2.5], np.float32)
    x[:len(special)] = special[:n]
    return x.astype(dtype)


@np.errstate(all="ignore")
def _reference(op, a, b, dtype):
    # min/max as the engine's std::min(in, acc) / std::max(in, acc): with a NaN, the incoming value.
    x, y = a.astype(np.float32), b.astype(np.float32)
    if op == 1:
        r = np.where(y < x, y, x)
    elif op == 2:
        r = np.where(x < y, y, x)
    else:
        r = OPS[op](x, y)
    return r.astype(dtype)


def _same(got, want):
    g, w = got.astype(np.float32), want.astype(np.float32)
    both_nan = np.isnan(g) & np.isnan(w)
    assert np.array_equal(np.where(both_nan, 0, g), np.where(both_nan, 0, w)), (g[g != w], w[g != w])
    assert np.array_equal(np.signbit(g[~both_nan]), np.signbit(w[~both_nan]))


@pytest.mark.parametrize("portable", [False, True], ids=["vector", "portable"])
@pytest.mark.parametrize("dtype", [np.dtype(np.float16), BF16], ids=["float16", "bfloat16"])
@pytest.mark.parametrize("op", [0, 1, 2, 3], ids=["sum", "min", "max", "product"])
@pytest.mark.parametrize("n", [1, 7, 8, 9, 1000, 4099])
def test_reduction_matches_numpy(portable, dtype, op, n):
    a, b = _inputs(dtype, n, 1), _inputs(dtype, n, 2)
    out = b.copy()
    path = engine_module().half_math_for_testing(dtype == BF16, op, a.view(np.uint16), out.view(np.uint16), 1.0,
                                                 portable)
    assert (path == "portable") == portable
    _same(out, _reference(op, a, b, dtype))


@pytest.mark.parametrize("portable", [False, True], ids=["vector", "portable"])
@pytest.mark.parametrize("dtype", [np.dtype(np.float16), BF16], ids=["float16", "bfloat16"])
@pytest.mark.parametrize("factor", [0.5, 1 / 3, 3.0, 1e-5])
def test_scaling_matches_numpy(portable, dtype, factor):
    a = _inputs(dtype, 1003, 3)
    out = a.copy()
    engine_module().half_math_for_testing(dtype == BF16, -1, out.view(np.uint16), out.view(np.uint16), factor, portable)
    with np.errstate(all="ignore"):
        want = (a.astype(np.float32) * np.float32(factor)).astype(dtype)
    _same(out, want)


def test_this_cpu_uses_the_vector_paths_it_has():
    flags = open("/proc/cpuinfo").read().split() if __import__("os").path.exists("/proc/cpuinfo") else []
    path = engine_module().half_math_for_testing(False, 0, np.zeros(1, np.uint16), np.zeros(1, np.uint16), 1.0, False)
    assert ("f16c" in path) == ("f16c" in flags and "avx" in flags)
    assert ("avx2" in path) == ("avx2" in flags)
