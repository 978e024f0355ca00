"""Helpers of tests/torch/workers/torch_ops_worker.py that do not depend on the rank: dtypes, torch
tensors from numpy references, and the comparison of a result with its reference."""
import zlib

import numpy as np
import torch

import collectives.torch as hvd
from common import BFLOAT16, assert_close_to_reference

TORCH_DTYPES = [torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64, torch.float16, torch.bfloat16,
                torch.float32, torch.float64, torch.bool]
NP_OF = {torch.uint8: np.uint8, torch.int8: np.int8, torch.int16: np.int16, torch.int32: np.int32,
         torch.int64: np.int64, torch.float16: np.float16, torch.bfloat16: BFLOAT16, torch.float32: np.float32,
         torch.float64: np.float64, torch.bool: np.bool_}
NUMERIC = [d for d in TORCH_DTYPES if d != torch.bool]
OPS = {"Sum": hvd.Sum, "Average": hvd.Average, "Min": hvd.Min, "Max": hvd.Max, "Product": hvd.Product}


def seed(label):
    return zlib.crc32(label.encode())


def to_torch(a, dtype):
    a = np.ascontiguousarray(a)
    if dtype == torch.bfloat16:
        return torch.from_numpy(a.view(np.int16).copy()).view(torch.bfloat16)
    return torch.from_numpy(a.copy())


def as_ref(t):
    t = t.detach()
    return t.numpy() if t.dtype == torch.bool else t.to(torch.float64).numpy()


def check(got, expected, dtype, shape=None, what="result"):
    assert isinstance(got, torch.Tensor), f"{what}: expected a torch.Tensor, got {type(got).__name__}"
    assert got.dtype == dtype, f"{what}: dtype {got.dtype} != {dtype}"
    expected = np.asarray(expected)
    shape = expected.shape if shape is None else tuple(shape)
    assert tuple(got.shape) == shape, f"{what}: shape {tuple(got.shape)} != {shape}"
    kind = ("bool" if dtype == torch.bool else "half" if dtype in (torch.float16, torch.bfloat16)
            else "float" if dtype.is_floating_point else "int")
    assert_close_to_reference(as_ref(got), expected, kind, what)


def expect_raises(exc, fn):
    try:
        fn()
    except exc as e:
        return e
    raise AssertionError(f"expected {exc.__name__}")


def noncontig(t):
    """A copy of ``t`` (2-d) laid out column-major: non-contiguous unless a dimension is 1."""
    return t.t().clone(memory_format=torch.contiguous_format).t()
