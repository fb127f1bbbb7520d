"""hpac.explain: one region run under off / full / selective (or its policy), with each decision, its reason, bytes
and time, and the memory timeline; rendered by the same C++ as hpac-explain (replay/explain.h)."""
import json
import os
from typing import Any, Callable, Optional, Sequence

import torch

from ._budget import Budget
from ._frame import checkpoint_with
from ._regions import Invocation, PolicyLike

EXPLAIN_MODES = ("off", "full", "selective")


class Explanation:
    """What hpac.explain found: `text` (the per-op table and summary), `data` (the JSON as a dict, schema
    "hpac.explain/1", docs/explain.md), `svg` (the memory timeline)."""

    def __init__(self, handle, rows):
        self._handle = handle
        self.text = handle.text(rows)
        self.json = handle.json()
        self.data = json.loads(self.json)
        self.svg = handle.svg()

    def __str__(self):
        return self.text


def _check_arguments(policy, modes, json_path, svg_path):
    """explain's refusals, before anything runs."""
    for m in modes:
        if m not in EXPLAIN_MODES:
            raise ValueError(f"hpac.explain: unknown mode {m!r}; allowed: {', '.join(EXPLAIN_MODES)}")
    if policy is None or policy == "off":
        raise ValueError(f"hpac.explain: policy {policy!r} checkpoints nothing, so there is nothing to explain; "
                         "allowed: a policy kind such as 'selective' or 'full', or a save list")
    for path in (json_path, svg_path):
        if path is not None:
            folder = os.path.dirname(os.path.abspath(path))
            if not os.path.isdir(folder) or not os.access(folder, os.W_OK):
                raise ValueError(f"hpac.explain: cannot write {path!r}: its folder {folder!r} does not exist or "
                                 "is not writable; give a path in an existing, writable folder")
    if not torch.is_grad_enabled():
        raise RuntimeError("hpac.explain needs grad mode on (it runs backward)")


def explain(fn: Callable, *args: Any, policy: PolicyLike = "selective", modes: Sequence[str] = EXPLAIN_MODES,
            loss: Optional[Callable[[Any], torch.Tensor]] = None, json_path: Optional[str] = None,
            svg_path: Optional[str] = None, rows: int = 0, name: Optional[str] = None, **kwargs: Any) -> "Explanation":
    """Explains one checkpoint region: runs fn and backward once per mode, capturing tensor bytes over each step
    (hpac's tracking CPU allocator, installed only while each drawn step runs and removed after, unless
    hpac.track_memory() installed it for good: Note [The tracker is installed while asked for],
    replay/tracking_allocator.h), and records what hpac did with each op of the `policy` run: decision, the rule or plan
    entry behind it, output bytes, measured µs. The same C++ renders hpac-explain's output.

    Args:
        fn: the region (a function or module), called as fn(*args, **kwargs).
        *args: its positional arguments.
        policy: a policy kind, a save list or a Budget, as for hpac.checkpoint; a Budget still profiling runs its
            profile first, so that the plan is explained.
        modes: a subset of "off", "full", "selective", in that order of drawing.
        loss: maps fn's result to the scalar backward starts from (default: the sum of the result).
        json_path: where to write the JSON (schema "hpac.explain/1", docs/explain.md).
        svg_path: where to write the memory timeline.
        rows: how many rows of the per-op table the text shows (0: all).
        name: the region's name in the report (default: fn's qualified name).
        **kwargs: fn's keyword arguments.

    Returns:
        An Explanation (text, data, svg).
    """
    _check_arguments(policy, modes, json_path, svg_path)
    label = policy if isinstance(policy, str) else "budget" if isinstance(policy, Budget) else "save_list"
    region = name or getattr(fn, "__qualname__", None) or type(fn).__name__
    handle = torch.classes.hpac.Explain(f"Python {region}", region, label)
    loss = loss or (lambda out: out.sum())

    def step(policy_for_step, explained, drawn):
        grads = [a for a in args if isinstance(a, torch.Tensor) and a.requires_grad]
        inv = None
        if policy_for_step == "off":
            out = fn(*args, **kwargs)
        else:
            inv = Invocation(policy_for_step, explain=explained)
            out = checkpoint_with(inv, fn, *args, **kwargs)
        value = loss(out)
        if drawn:
            handle.mark("backward")
        torch.autograd.backward(value, inputs=grads or None)
        return inv

    tensors = [a for a in args if isinstance(a, torch.Tensor)]
    if isinstance(fn, torch.nn.Module):
        tensors += list(fn.parameters())

    explained_inv = None
    if isinstance(policy, Budget) and policy.stage == "profiling":
        step(policy, False, False)  # the budget's profile, so that the explained call replays its plan
    for m in list(modes) + ([] if label in modes else [label]):
        drawn = m in modes
        for t in tensors:  # the previous step's gradients are freed before this step's timeline
            t.grad = None
        if drawn:
            handle.capture_begin()
        inv = step(policy if m == label else m, m == label, drawn)
        if drawn:
            handle.capture_end(m)
        if m == label:
            explained_inv = inv
    handle.set_invocation(explained_inv._handle)
    result = Explanation(handle, rows)
    if json_path is not None:
        handle.write(json_path, "json")
    if svg_path is not None:
        handle.write(svg_path, "svg")
    return result
