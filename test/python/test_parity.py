"""The comparison behind the Python parity tests (parity.py): NaN, infinity and missing tensors are never equal,
and a failure names the tensor and the index."""
import math

import pytest
import torch

from hpac.harness.parity import assert_same, compare


def test_equal_and_different():
    a = torch.arange(6.0).reshape(2, 3)
    assert compare([a, a], [a.clone(), a.clone()]) == (0.0, "")
    worst, where = compare([a, a], [a, a + torch.tensor([[0, 0, 0], [0, 0.5, 0]])], names=["x", "y"])
    assert worst == 0.5 and where == "y[1, 1]: 4.0 vs 4.5"
    assert compare([a], [a, a])[0] == math.inf
    assert compare([a], [a.reshape(3, 2)])[0] == math.inf


def test_nan_inf_and_missing_are_never_equal():
    ok = torch.ones(4)
    nan = ok.clone()
    nan[2] = math.nan
    assert compare([nan], [nan.clone()]) == (math.inf, "tensor 0[2]: nan vs nan (not finite)")
    assert compare([ok * 3, nan], [ok, ok])[0] == math.inf  # behind a larger finite difference
    assert compare([ok], [ok * math.inf])[0] == math.inf
    assert compare([None], [None])[0] == math.inf
    assert compare([None], [None], allow_missing=True) == (0.0, "")
    with pytest.raises(AssertionError, match=r"w\[2\]: nan vs 1.0 \(not finite\)"):
        assert_same([nan], [ok], names=["w"], atol=1e9)
