"""A numpy reference of the Adasum reduction (Horovod's op=Adasum), for the Adasum workers.

Two vectors a and b combine as a * (1 - a.b / (2|a|^2)) + b * (1 - a.b / (2|b|^2)), a squared
norm below sqrt(smallest normal double) counting as zero (its coefficient is then 1), and
the ranks' vectors combine pairwise in a binary tree over the ranks in rank order: (0,1),
(2,3), ... then the results pairwise again. Every tensor of a group combines on its own.
"""
import numpy as np

TINY_NORM_SQ = np.sqrt(np.finfo(np.float64).tiny)


def combine(a, b):
    """The Adasum of two float64 vectors."""
    dot, a_sq, b_sq = float(a @ b), float(a @ a), float(b @ b)
    a_coef = 1.0 - dot / (2.0 * a_sq) if a_sq >= TINY_NORM_SQ else 1.0
    b_coef = 1.0 - dot / (2.0 * b_sq) if b_sq >= TINY_NORM_SQ else 1.0
    return a_coef * a + b_coef * b


def adasum(per_rank, dtype=np.float64):
    """The Adasum over ranks of ``per_rank`` (rank r's tensor at index r; a power-of-two count),
    as float64, rounded to ``dtype`` after each level of the tree as the engine stores it."""
    shape = np.shape(per_rank[0])
    level = [np.asarray(v, np.float64).ravel() for v in per_rank]
    assert len(level) & (len(level) - 1) == 0, "Adasum needs a power-of-two number of ranks"
    while len(level) > 1:
        level = [combine(level[i], level[i + 1]).astype(dtype).astype(np.float64) for i in range(0, len(level), 2)]
    return level[0].reshape(shape)


def assert_close(actual, expected, rel, label=""):
    """Norm-wise relative error of ``actual`` against ``expected`` below ``rel``."""
    actual = np.asarray(actual, np.float64)
    expected = np.asarray(expected, np.float64)
    assert actual.shape == expected.shape, f"{label}: shape {actual.shape} != {expected.shape}"
    scale = max(float(np.linalg.norm(expected)), 1e-300)
    err = float(np.linalg.norm(actual - expected)) / scale
    assert err <= rel, f"{label}: relative error {err:.3g} > {rel:.3g}\nactual   {actual.ravel()[:8]}\nexpected {expected.ravel()[:8]}"


# Norm-wise tolerance per dtype: the engine's dot products are summed in another order and its
# float16 results are rounded through float.
TOLERANCE = {np.dtype(np.float16): 3e-3, np.dtype(np.float32): 2e-6, np.dtype(np.float64): 1e-13}
