"""torchtitan's activation checkpointing, run by hpac: one line where torchtitan 0.3.0 applies its own
(torchtitan/distributed/activation_checkpoint.py: `SelectiveAC(config).apply(model)`).

    import hpac.torchtitan
    hpac.torchtitan.apply_ac(model, hpac.torchtitan.Config(mode="torchtitan"))   # torchtitan's rules, in C++
    hpac.torchtitan.apply_ac(model, job_config.activation_checkpoint)            # torchtitan's own config object
    hpac.torchtitan.ActivationCheckpointing(config).apply(model)                 # torchtitan's call shape

Every transformer block of `model.layers` is wrapped as torchtitan wraps it (torch's checkpoint_wrapper, non-reentrant,
early_stop off, preserve_rng_state / determinism_check / debug from the config), with an hpac region as context_fn.
`mode` picks what the region keeps:
    "torchtitan"  torchtitan 0.3.0's SelectiveAC rules as the C++ kind `torchtitan` (no Python per op), with its
                  force_recompute_mm_shapes_by_fqns resolved per block as torchtitan does
    "selective"   hpac's built-in selective rules
    "full"        recompute everything
    "budget"      hpac's eager memory budget, `memory_budget` a fraction of what a block keeps without checkpointing
                  (torchtitan's memory-budget mode needs torch.compile; this one runs eagerly), one region per block
    any other hpac kind ("save_all_but", "save_occurrences", ...) with `policy_params`
torchtitan's own config classes are taken as they are: SelectiveAC.Config -> "torchtitan", FullAC.Config -> "full",
MemoryBudgetAC.Config -> "budget" with its memory_budget. torchtitan itself is imported only for those, and only here.
"""
from dataclasses import dataclass, field
from typing import Any, List, Optional, Sequence

import torch

import hpac

__all__ = ["Config", "ActivationCheckpointing", "apply_ac", "policy_for_block"]

MODES = ("torchtitan", "selective", "full", "budget")


@dataclass
class Config:
    """torchtitan's ActivationCheckpointing.Config fields, plus what hpac needs to pick a policy.

    Args:
        mode: "torchtitan", "selective", "full", "budget", or another hpac policy kind (with policy_params).
        memory_budget: with mode "budget": a fraction in [0, 1] of what each block keeps with checkpointing off.
        force_recompute_mm_shapes_by_fqns: as torchtitan's SelectiveAC.Config (mode "torchtitan").
        policy_params: the parameters of another hpac kind (hpac.PolicySpec).
        preserve_rng_state, determinism_check, debug: as torchtitan's, handed to torch's checkpoint.
    """

    mode: str = "torchtitan"
    memory_budget: float = 0.5
    force_recompute_mm_shapes_by_fqns: List[str] = field(default_factory=lambda: ["moe.router.gate"])
    policy_params: Sequence[Any] = ()
    preserve_rng_state: bool = True
    determinism_check: str = "default"
    debug: bool = False


def _from_torchtitan(config) -> Config:
    """hpac's Config of one of torchtitan's config objects (imports torchtitan: only called for its objects)."""
    from torchtitan.distributed import activation_checkpoint as tt
    common = dict(preserve_rng_state=config.preserve_rng_state, determinism_check=config.determinism_check,
                  debug=config.debug)
    if isinstance(config, tt.SelectiveAC.Config):
        return Config(mode="torchtitan", force_recompute_mm_shapes_by_fqns=list(
            config.force_recompute_mm_shapes_by_fqns), **common)
    if isinstance(config, tt.FullAC.Config):
        return Config(mode="full", **common)
    if isinstance(config, tt.MemoryBudgetAC.Config):
        return Config(mode="budget", memory_budget=config.memory_budget, **common)
    raise ValueError(f"hpac.torchtitan: torchtitan config {type(config).__qualname__} is not allowed; allowed: "
                     "SelectiveAC.Config, FullAC.Config, MemoryBudgetAC.Config, or hpac.torchtitan.Config")


def _config(config) -> Config:
    if config is None:
        return Config()
    if isinstance(config, Config):
        return config
    if type(config).__module__.startswith("torchtitan"):
        return _from_torchtitan(config)
    raise TypeError(f"hpac.torchtitan: config must be hpac.torchtitan.Config or one of torchtitan's activation "
                    f"checkpointing configs, got {type(config).__name__}")


def policy_for_block(config: Config, block: torch.nn.Module, base_fqn: str = ""):
    """The hpac policy one block runs under `config` (a kind name, a PolicySpec, or a new Budget)."""
    if config.mode == "torchtitan":
        shapes = hpac.torchtitan_mm_shapes(block, config.force_recompute_mm_shapes_by_fqns, base_fqn=base_fqn)
        return hpac.PolicySpec("torchtitan", shapes) if shapes else "torchtitan"
    if config.mode == "budget":
        return hpac.budget(config.memory_budget)
    if config.policy_params:
        return hpac.PolicySpec(config.mode, config.policy_params)
    return config.mode  # checked in C++ when the context_fn is made: "'X' ... allowed: ..."


class ActivationCheckpointing:
    """torchtitan's ActivationCheckpointing with hpac's regions: `ActivationCheckpointing(config).apply(model)`."""

    def __init__(self, config=None, dump_folder: str = ""):
        self.config = _config(config)
        self.dump_folder = dump_folder

    def _wrap_block(self, module: torch.nn.Module, *, base_fqn: Optional[str] = None) -> torch.nn.Module:
        from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper
        c = self.config
        policy = policy_for_block(c, module, base_fqn or "")
        return checkpoint_wrapper(module, context_fn=hpac.context_fn(policy), preserve_rng_state=c.preserve_rng_state,
                                  determinism_check=c.determinism_check, early_stop=False, debug=c.debug)

    def apply(self, model: torch.nn.Module) -> None:
        """Wraps every transformer block of model.layers, as torchtitan's apply does."""
        layers = model.get_submodule("layers")
        for layer_id, block in layers.named_children():
            layers.register_module(layer_id, self._wrap_block(block, base_fqn=f"layers.{layer_id}"))


def apply_ac(model: torch.nn.Module, config=None) -> torch.nn.Module:
    """ActivationCheckpointing(config).apply(model); returns model."""
    ActivationCheckpointing(config).apply(model)
    return model
