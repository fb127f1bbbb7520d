"""Policies from the field as data: kinds of hpac's C++ rules that take parameters (policy/field_policies.h).

    hpac.context_fn("torchtitan")                                              # torchtitan 0.3.0's SelectiveAC
    hpac.context_fn(hpac.PolicySpec("torchtitan", hpac.torchtitan_mm_shapes(layer, ["mlp.gate"])))
    hpac.context_fn(hpac.PolicySpec("save_all_but", [torch.ops.aten.mul.Tensor, "aten::relu"]))
    hpac.context_fn(hpac.PolicySpec("save_occurrences", ["aten::mm@::2", "aten::bmm@0"]))

No Python runs per op: the kind and its parameters are parsed and checked once, in C++, when the policy is made.
"""
from dataclasses import dataclass
from typing import Iterable, List, Tuple

import torch

from . import _policy_fn


def _param(kind: str, value) -> str:
    """One parameter as C++ takes it: an (in, out) pair as 'INxOUT', an op (OpOverload, OpOverloadPacket) as its
    name, a string as given."""
    if isinstance(value, str):
        return value
    if isinstance(value, (tuple, list, torch.Size)) and len(value) == 2 and all(isinstance(v, int) for v in value):
        return f"{value[0]}x{value[1]}"
    names = _policy_fn.save_list_names([value])
    if not names:
        raise ValueError(f"hpac.PolicySpec('{kind}'): {value!r} is a higher-order operator, which eager hpac never "
                         "sees; leave it out")
    return names[0]


@dataclass(frozen=True)
class PolicySpec:
    """A kind of hpac's C++ rules and its parameters, usable wherever a policy is (hpac.context_fn, hpac.Invocation,
    hpac.checkpoint, checkpoint_wrapper's policy). Hashable, so a context_fn holding it compiles once per spec.

    Args:
        kind: a policy kind name (policy/policy_kind.h): "torchtitan", "save_all_but", "save_occurrences",
            "save_list", or one without parameters ("selective", "full", "save_all").
        params: torchtitan: force-recompute mm shapes as (in, out) pairs or "INxOUT" (torchtitan_mm_shapes makes
            them from module names); save_all_but / save_list: ops (OpOverloads, OpOverloadPackets, op names);
            save_occurrences: patterns "ns::op[.overload]@ITEMS" (Note [Occurrence patterns]).
    """

    kind: str
    params: Tuple[str, ...] = ()

    def __post_init__(self):
        if not isinstance(self.kind, str):
            raise TypeError(f"hpac.PolicySpec: kind must be a policy kind name (str), got {type(self.kind).__name__}")
        if isinstance(self.params, (str, bytes)):
            raise TypeError(f"hpac.PolicySpec('{self.kind}'): params must be a list, got the string {self.params!r}")
        object.__setattr__(self, "params", tuple(_param(self.kind, p) for p in self.params))


def torchtitan_mm_shapes(module: torch.nn.Module, fqns: Iterable[str] = ("moe.router.gate",),
                         base_fqn: str = "") -> List[Tuple[int, int]]:
    """The force-recompute mm shapes of torchtitan's SelectiveAC (force_recompute_mm_shapes_by_fqns): the
    (in_features, out_features) of every submodule of `module` whose name (prefixed by `base_fqn`, as torchtitan
    prefixes "layers.<i>") contains one of `fqns`, sorted. torchtitan accepts nn.Linear only; a module that holds a
    2-D `weight` applied as F.linear (a transformers router such as Qwen3-MoE's `mlp.gate`) counts as one here.
    Anything else matching raises ValueError as torchtitan does."""
    fqns = [fqns] if isinstance(fqns, str) else list(fqns)
    shapes = set()
    if not fqns:
        return []
    for name, sub in module.named_modules():
        fqn = f"{base_fqn}.{name}" if base_fqn else name
        if not any(f in fqn for f in fqns):
            continue
        weight = getattr(sub, "weight", None)
        if not isinstance(sub, torch.nn.Linear) and not (isinstance(weight, torch.Tensor) and weight.dim() == 2):
            raise ValueError(f"force_recompute_mm_shapes_by_fqns expected to match a nn.Linear (or a module with a "
                             f"2-D weight applied as F.linear), but '{fqn}' is: {sub}")
        out_f, in_f = weight.shape
        shapes.add((int(in_f), int(out_f)))
    return sorted(shapes)


__all__ = ["PolicySpec", "torchtitan_mm_shapes"]


def policy_kind(policy) -> Tuple[str, List[str]]:
    """(kind, parameters) of a policy that is not a Budget: a kind name, None (full), a PolicySpec, a policy function
    (kind policy_fn) or a save list (op names, OpOverloads, OpOverloadPackets)."""
    if policy is None:
        return "full", []
    if isinstance(policy, str):
        return policy, []
    if isinstance(policy, PolicySpec):
        return policy.kind, list(policy.params)
    if callable(policy):
        return "policy_fn", []
    return "save_list", _policy_fn.save_list_names(list(policy))
