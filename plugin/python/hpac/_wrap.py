"""Wrapping a module's forward in a checkpoint, in place: the one mechanism behind hpac.checkpoint_wrapper and
hpac.hf.prepare. The module object, its children and its state_dict keys stay exactly as they were; one instance
attribute holds the original forward, and unwrap_checkpoint restores it, whoever wrapped."""
import functools
import types
from typing import Any, Callable

import torch

from ._budget import Budget
from ._frame import checkpoint

_ORIGINAL = "_hpac_original_forward"
_CHECKPOINTED = "_hpac_checkpointed"


def _wrapped_forward(self, *args, **kwargs):
    # One function for every wrapped module, bound to each (types.MethodType): torch.compile then guards on this
    # function, not on a per-module object, and modules of one shape share one compiled graph.
    d = self.__dict__
    return d[_CHECKPOINTED](d[_ORIGINAL], *args, **kwargs)


def wrap_forward(module: torch.nn.Module, checkpointed: Callable[..., Any]) -> torch.nn.Module:
    """Replaces module.forward with checkpointed(original_forward, *args, **kwargs); an earlier wrap is undone
    first. Returns module."""
    unwrap_checkpoint(module)
    original = module.forward
    module.__dict__[_ORIGINAL] = original
    module.__dict__[_CHECKPOINTED] = checkpointed
    module.forward = types.MethodType(_wrapped_forward, module)
    return module


def unwrap_checkpoint(module: torch.nn.Module) -> torch.nn.Module:
    """Undoes checkpoint_wrapper (or hpac.hf.prepare's wrap) of module. Returns module."""
    if module.__dict__.pop(_ORIGINAL, None) is not None:
        module.__dict__.pop(_CHECKPOINTED, None)
        module.__dict__.pop("forward", None)
    return module


def is_wrapped(module: torch.nn.Module) -> bool:
    return _ORIGINAL in module.__dict__


def _hpac_checkpointed(mode, rules, original, *args, **kwargs):
    return checkpoint(original, *args, policy=mode, **dict(rules), **kwargs)


def checkpoint_wrapper(module: torch.nn.Module, mode: Any = "full", *, routing: str = "verify",
                       state_writes: str = "warn", respect_saved_tensors_hooks: bool = True) -> torch.nn.Module:
    """Checkpoints every call of module by replacing its forward in place (hpac.checkpoint; under torch.compile
    torch.utils.checkpoint with hpac's context_fn).

    Args:
        module: the module; it, its children and its state_dict keys stay exactly as they were.
        mode: 'full', 'selective', a Budget from hpac.budget(...), which then serves this module's calls, or a
            policy function policy_fn(ctx, op, *args, **kwargs) as torch's SAC takes it (docs/python.md, "From
            PyTorch's SAC").
        routing, state_writes, respect_saved_tensors_hooks: as hpac.checkpoint's.

    Returns:
        module. unwrap_checkpoint(module) undoes it.
    """
    if not isinstance(mode, Budget) and not callable(mode) and mode not in ("full", "selective"):
        raise ValueError(f"hpac: checkpoint_wrapper mode {mode!r} is not allowed; allowed: 'full', 'selective', "
                         "hpac.budget(...), a policy function")
    if not isinstance(module, torch.nn.Module):
        raise TypeError(f"hpac: checkpoint_wrapper expects a torch.nn.Module, got {type(module).__name__}")
    rules = (("routing", routing), ("state_writes", state_writes),
             ("respect_saved_tensors_hooks", bool(respect_saved_tensors_hooks)))
    return wrap_forward(module, functools.partial(_hpac_checkpointed, mode, rules))
