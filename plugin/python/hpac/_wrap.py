"""Wrapping a module's forward in a checkpoint, in place: the one mechanism behind hpac.checkpoint_wrapper and
hpac.hf.prepare. The module object, its children and its state_dict keys stay exactly as they were; one instance
attribute holds the original forward, and unwrap_checkpoint restores it, whoever wrapped."""
import functools
import types
import warnings
from typing import Any, Callable

import torch

from ._frame import checkpoint_call
from ._regions import PolicyLike, RegionOptions, check_region

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


def _hpac_checkpointed(policy, options, original, /, *args, **kwargs):
    # options: RegionOptions.flat(), constants in the partial Dynamo guards on (Note [context_fn under torch.compile]).
    return checkpoint_call(original, args, kwargs, policy, RegionOptions(*options))


def checkpoint_wrapper(module: torch.nn.Module, policy: PolicyLike = None, *, mode: PolicyLike = None,
                       routing: str = "verify", state_writes: str = "warn",
                       respect_saved_tensors_hooks: bool = True) -> torch.nn.Module:
    """Checkpoints every call of module under `policy`, in place: module.forward becomes hpac.checkpoint of the
    original forward (under torch.compile torch.utils.checkpoint with hpac's context_fn).

    Unlike torch's torch.distributed.algorithms._checkpoint.checkpoint_wrapper, which returns a new
    CheckpointWrapper module holding `module` (state_dict keys gain "_checkpoint_wrapped_module.", and the caller
    puts the wrapper in the parent's place), this returns `module` itself: the object, its children, its hooks and
    its state_dict keys stay exactly as they were, and only the instance's forward changes. Where torch's takes
    checkpoint_impl, checkpoint_fn and their keywords, this takes hpac's policy; the checkpoint is always
    non-reentrant, with hpac.checkpoint's defaults (RNG state preserved, determinism checked).

    Args:
        module: the module to checkpoint.
        policy: any policy hpac.checkpoint takes: a kind name ("full", "selective", "save_all", "torchtitan", ...),
            a PolicySpec, a save list of ops, a policy function policy_fn(ctx, op, *args, **kwargs) as torch's SAC
            takes it, or a Budget from hpac.budget(...), which then serves this module's calls. None: "full".
            Checked now: an unknown kind raises RuntimeError naming it and the kinds allowed.
        mode: the old name of policy: deprecated (DeprecationWarning); giving both is a TypeError.
        routing, state_writes, respect_saved_tensors_hooks: as hpac.checkpoint's.

    Returns:
        module. unwrap_checkpoint(module) undoes it.
    """
    if mode is not None:
        if policy is not None:
            raise TypeError("hpac: checkpoint_wrapper got both policy= and mode=, its deprecated alias; pass policy= "
                            "only")
        warnings.warn("hpac: checkpoint_wrapper(module, mode=...) is deprecated; pass policy=... (it takes every "
                      "policy hpac.checkpoint takes)", DeprecationWarning, stacklevel=2)
        policy = mode
    if not isinstance(module, torch.nn.Module):
        raise TypeError(f"hpac: checkpoint_wrapper expects a torch.nn.Module, got {type(module).__name__}")
    policy = "full" if policy is None else policy
    options = RegionOptions(routing, state_writes, respect_saved_tensors_hooks)
    check_region(policy, options)
    return wrap_forward(module, functools.partial(_hpac_checkpointed, policy, options.flat()))
