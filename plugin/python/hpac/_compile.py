"""hpac under torch.compile (Note [hpac under torch.compile], docs/design.md).

Inside compiled code no op passes hpac's dispatch key. When torch.compile traces a region checkpointed with
hpac.context_fn (or hpac.checkpoint / checkpoint_wrapper, which then take torch.utils.checkpoint's path), the
region's contexts are PyTorch's own selective checkpoint modes (torch.utils.checkpoint.
create_selective_checkpoint_contexts), whose policy function asks hpac's C++ policy about each traced op
(torch.classes.hpac.TracedPolicy, policy/traced_policy.h): the same rules, tables, save lists and per-region
counters as in eager. The answer becomes the traced node's `recompute` tag, which the partitioner obeys (MUST_*) or
may override (PREFER_*). The rules live in C++ only; this module only forwards op names and answers.
"""
import collections
from typing import Deque

import torch

from ._budget import Budget
from ._field_policies import policy_kind
from ._policy_fn import checked_policy_fn

# While RECORD is True (tests, tools that show what the policy saw under compile), the TracedPolicy handles of the
# regions traced last (newest at the end), each logging every op it was asked about. Off by default: a training
# job keeps nothing here and no traced policy logs (Note [Nothing outlives its model], _regions.py).
RECORD = False
TRACED: Deque = collections.deque(maxlen=64)

_MODE_KEYS = getattr(torch._C, "_TorchDispatchModeKey", None)  # torch >= 2.1


def dynamo_tracing() -> bool:
    """Whether Dynamo is tracing the running Python code (torch.compile's front end)."""
    compiler = getattr(torch, "compiler", None)
    return compiler is not None and hasattr(compiler, "is_compiling") and compiler.is_compiling()


def tracing() -> bool:
    """Whether the running ops are being traced rather than run: Dynamo, AOTAutograd's trace (a proxy mode is
    active: torch.utils.checkpoint's own test) or the fake-tensor pass torch.compile makes of a checkpointed body."""
    if dynamo_tracing():
        return True
    if _MODE_KEYS is None:
        return False
    get = torch._C._get_dispatch_mode
    return get(_MODE_KEYS.PROXY) is not None or get(_MODE_KEYS.FAKE) is not None


def _op_name(op):
    """(name, overload) of a traced op as the dispatcher names it ('aten::mm', ''); a higher-order operator has
    no schema: (its name, '')."""
    schema = getattr(op, "_schema", None)
    if schema is None:
        return str(getattr(op, "_name", op)), ""
    overload = op._overloadname
    return schema.name, "" if overload == "default" else overload


def traced_contexts(policy, allow_cache_entry_mutation: bool, routing: str = "verify"):
    """PyTorch's (caching, cached) selective checkpoint modes for one traced region, deciding with a new
    TracedPolicy of `policy` (a kind name or a save list; a Budget is refused). routing "save" saves the routing
    ops there too; "verify" has nothing to compare in compiled code, whose recompute is a graph of its own (Note
    [Routing is verified])."""
    from torch.utils.checkpoint import CheckpointPolicy, create_selective_checkpoint_contexts


    if isinstance(policy, Budget):
        raise RuntimeError(
            "hpac: a memory budget (hpac.budget) cannot decide a region that torch.compile traces: its plan is made "
            "from an eager profile of the region, which compiled code never runs. Under torch.compile use its own "
            "budget: torch._functorch.config.activation_memory_budget = 0.5 with the region checkpointed by "
            "torch.utils.checkpoint (no context_fn); or run the budgeted region eagerly")
    kind, names = policy_kind(policy)
    if kind == "policy_fn":  # the user's own function decides each traced op, as with torch's SAC
        return create_selective_checkpoint_contexts(checked_policy_fn(policy), allow_cache_entry_mutation)
    traced = torch.classes.hpac.TracedPolicy(kind, names, routing == "save", RECORD)
    if RECORD:
        TRACED.append(traced)
    answers = list(CheckpointPolicy)  # the same order as hpac's CheckpointPolicy (policy/checkpoint_policy.h)

    def policy_fn(ctx, op, *args, **kwargs):
        return answers[traced.decide(*_op_name(op))]

    return create_selective_checkpoint_contexts(policy_fn, allow_cache_entry_mutation)
