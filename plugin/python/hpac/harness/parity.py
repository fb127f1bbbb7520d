"""The one comparison behind the Python parity tests (the C++ tests' is compareTensors in tools/evidence/compare.h).

assert_same(got, ref) fails when the lists differ in length, a tensor is missing or differs in shape, either side
holds a NaN or an infinity, a tensor is None (never equal, even at the same place), or the largest absolute difference exceeds atol;
the message names the tensor and the index of the worst (or first non-finite) element.
"""
import torch


def _as_list(x):
    return list(x) if isinstance(x, (list, tuple)) else [x]


def compare(got, ref, names=None, allow_missing=False):
    """(max |got - ref| as a float, where): +inf when not comparable or not finite; where is '' when equal.

    A None (a gradient never produced) fails unless allow_missing, and then only when both sides lack it."""
    got, ref = _as_list(got), _as_list(ref)
    if len(got) != len(ref):
        return float("inf"), f"the lists hold {len(got)} and {len(ref)} tensors"
    names = names if names is not None and len(names) == len(got) else [f"tensor {i}" for i in range(len(got))]
    worst, where = 0.0, ""
    for name, a, b in zip(names, got, ref):
        if (a is None) != (b is None):
            return float("inf"), f"{name}: defined on one side only"
        if a is None:
            if allow_missing:
                continue
            return float("inf"), f"{name}: missing on both sides"
        if a.shape != b.shape:
            return float("inf"), f"{name}: shapes {tuple(a.shape)} vs {tuple(b.shape)}"
        if a.numel() == 0:
            continue
        x, y = a.detach().double().reshape(-1), b.detach().double().reshape(-1)
        bad = ~torch.isfinite(x) | ~torch.isfinite(y)
        if bad.any():
            i = int(bad.nonzero()[0, 0])
            return float("inf"), f"{name}{_index(a, i)}: {x[i].item()} vs {y[i].item()} (not finite)"
        d = (x - y).abs()
        i = int(d.argmax())
        if d[i].item() > worst:
            worst, where = d[i].item(), f"{name}{_index(a, i)}: {x[i].item()} vs {y[i].item()}"
    return worst, where


def _index(t, flat):
    index = []
    for size in reversed(t.shape):
        index.append(flat % size)
        flat //= size
    return list(reversed(index))


def assert_same(got, ref, names=None, atol=0.0):
    worst, where = compare(got, ref, names)
    assert worst <= atol, f"max |diff| {worst} at {where} (tolerance {atol})"
