"""RegionOptions: what a checkpoint region does besides its policy, one frozen value (a module of its own so that
hpac._budget and hpac._regions both import it without importing each other)."""
import dataclasses
from typing import Tuple


@dataclasses.dataclass(frozen=True)
class RegionOptions:
    """What a checkpoint region does besides its policy: the three options hpac.checkpoint, hpac.context_fn,
    hpac.Invocation and hpac.checkpoint_wrapper take as keywords, carried as one value between them (and hpac.hf).
    Checked in C++ when the region's Invocation is made ("'X' is not allowed; allowed: ...").

    Args:
        routing: "verify" or "save": what hpac does about MoE routing ops in the recompute (Note [Routing is
            verified], replay/routing_check.h).
        state_writes: "warn", "error" or "skip": in-place writes to tensors from outside the region in the recompute
            (Note [State written twice]).
        respect_saved_tensors_hooks: what the region keeps goes through the saved_tensors_hooks around it (Note
            [Outer saved-tensor hooks]); False bypasses them.
    """

    routing: str = "verify"
    state_writes: str = "warn"
    respect_saved_tensors_hooks: bool = True

    def __post_init__(self):
        object.__setattr__(self, "routing", str(self.routing))
        object.__setattr__(self, "state_writes", str(self.state_writes))
        object.__setattr__(self, "respect_saved_tensors_hooks", bool(self.respect_saved_tensors_hooks))

    def flat(self) -> Tuple[str, str, bool]:
        """(routing, state_writes, respect_saved_tensors_hooks): constants, as the C++ constructors and a
        functools.partial that Dynamo guards on take them (Note [context_fn under torch.compile])."""
        return self.routing, self.state_writes, self.respect_saved_tensors_hooks
