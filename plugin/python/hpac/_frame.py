"""hpac.checkpoint: hpac's own non-reentrant checkpoint frame, built on torch.autograd.graph.saved_tensors_hooks
(works on torch 1.13, which has no context_fn). Under torch.compile it takes torch.utils.checkpoint's path with
hpac's context_fn instead (Dynamo cannot trace this frame's hooks). It takes torch.utils.checkpoint's keywords
(Note [torch's keywords on hpac.checkpoint])."""
import contextlib
import threading
from typing import Any, Callable, Dict, Optional, Sequence, Union

import torch
import torch.utils.checkpoint

from . import _compile
from ._regions import (_TOP_HOOKS, Invocation, PolicyLike, RegionOptions, _cache_entry_mutation, new_invocation,
                       region_context_fn)

# torch.utils.checkpoint's determinism_check values, and hpac's earlier bools.
_DETERMINISM_CHECKS = ("default", "none")


def _determinism_check_on(value: Union[str, bool]) -> bool:
    if isinstance(value, bool):
        return value
    if value not in _DETERMINISM_CHECKS:
        raise ValueError(f"hpac.checkpoint: determinism_check {value!r} is not allowed; allowed: "
                         f"{', '.join(repr(v) for v in _DETERMINISM_CHECKS)} (as torch.utils.checkpoint), True, False")
    return value == "default"


# Note [torch's keywords on hpac.checkpoint]
# A torch user calls hpac.checkpoint as torch.utils.checkpoint.checkpoint, with torch's keywords, and none of them
# may reach fn. Each is a parameter of hpac.checkpoint: preserve_rng_state, determinism_check and early_stop mean
# what torch's mean; use_reentrant False or None is what hpac does anyway (a non-reentrant checkpoint under
# saved_tensors_hooks), and True is refused; context_fn is refused, because the region's contexts are hpac's, made
# from policy=. debug=True is refused as torch refuses it beside any context_fn but its own ("debug=True is
# incompatible with non-default context_fn"): its operator traces come from a context_fn of torch's own, and hpac's
# region takes that place. hpac.explain and Invocation(record_ops=True).op_log() show each op and its decision.
_NOOP_CONTEXT_FN = getattr(torch.utils.checkpoint, "noop_context_fn", None)  # torch >= 2.0; 1.13 has no context_fn


def _refuse_torch_only(use_reentrant: Optional[bool], context_fn: Optional[Callable], debug: bool) -> None:
    """Refuses the values of torch.utils.checkpoint's keywords that hpac's checkpoint cannot honour, each with
    what to do instead (Note [torch's keywords on hpac.checkpoint])."""
    if use_reentrant is not None and use_reentrant is not False:
        raise ValueError(
            f"hpac.checkpoint: use_reentrant={use_reentrant!r} is not allowed; allowed: False, None. hpac's checkpoint "
            "is non-reentrant (torch's use_reentrant=False: what backward needs is recomputed through "
            "saved_tensors_hooks). Pass use_reentrant=False, or for the reentrant variant call "
            "torch.utils.checkpoint.checkpoint(fn, ..., use_reentrant=True) without hpac")
    if context_fn is not None and context_fn is not _NOOP_CONTEXT_FN:
        raise ValueError(
            "hpac.checkpoint: context_fn is not allowed: hpac makes the region's contexts from policy=. Pass the "
            "policy as hpac.checkpoint(fn, ..., policy=...), or keep torch's checkpoint for a context_fn: "
            "torch.utils.checkpoint.checkpoint(fn, ..., use_reentrant=False, context_fn=hpac.context_fn(policy)) "
            "runs an hpac policy there")
    if debug:
        raise ValueError(
            f"hpac.checkpoint: debug={debug!r} is not allowed; allowed: False. torch's debug traces come from a "
            "context_fn of its own, which torch refuses beside any other, and hpac's region is one. Each op's "
            "decision: hpac.explain(fn, *args, policy=...) or hpac.Invocation(policy, record_ops=True).op_log()")


def _cuda_devices(tensors):
    return sorted({t.device.index for t in tensors if isinstance(t, torch.Tensor) and t.is_cuda})


class _StopRecompute(Exception):
    """Raised by the recompute's pack hook once it has every tensor backward wants from it (Note [The recompute
    stops early], replay/checkpoint.cpp); caught by the frame."""


class _Placeholder:
    """What autograd keeps for one saved tensor: its index in the frame, and the tensor itself (`held`, with its
    version then) when the region keeps it anyway (Note [Frames hold what needs no recompute], replay/invocation.h)."""
    __slots__ = ("frame", "index", "held", "version")

    def __init__(self, frame, index, held=None):
        self.frame = frame
        self.index = index
        self.held = held
        self.version = held._version if held is not None else 0


class _Frame:
    """State of one hpac.checkpoint call; owned by the placeholders in the graph."""

    def __init__(self, fn, args, kwargs, invocation, preserve_rng_state, determinism_check, outer_hooks=None,
                 hold_saved=True, early_stop=True):
        self.fn = fn
        self.early_stop = early_stop
        self.kwargs = kwargs
        # The inputs the recompute needs: through the saved_tensors_hooks around the checkpoint, as autograd saves
        # torch.utils.checkpoint's (Note [Outer saved-tensor hooks], replay/outer_hooks.h).
        self.unpack_input = outer_hooks[1] if outer_hooks is not None else None
        pack = outer_hooks[0] if outer_hooks is not None else None
        self.args = [(pack(a.detach()) if pack is not None else a.detach()) if isinstance(a, torch.Tensor) else a
                     for a in args]
        self.is_tensor = [isinstance(a, torch.Tensor) for a in args]
        self.requires_grad = [isinstance(a, torch.Tensor) and a.requires_grad for a in args]
        self.invocation = invocation
        # Note [Frames hold what needs no recompute] (replay/invocation.h): hpac's C++ invocation says what to hold.
        self.hold = invocation._handle.hold_saved if hold_saved and isinstance(invocation, Invocation) else None
        self.forward_region = invocation.region("forward")
        self.determinism_check = determinism_check
        self.meta = []
        self.held = []  # per placeholder: its tensor is held (Note [Frames hold what needs no recompute])
        self.recomputed = {}
        self.lock = threading.Lock()
        self.devices = _cuda_devices(args) if preserve_rng_state else None
        if preserve_rng_state:
            self.cpu_rng = torch.get_rng_state()
            self.cuda_rng = [torch.cuda.get_rng_state(d) for d in self.devices]

    def pack(self, tensor):
        # torch 1.13: the forward region cannot wrap these hooks and asks the frame to report what autograd saves.
        note = getattr(self.forward_region, "note_saved", None)
        if note is not None:
            note(tensor)
        self.meta.append((tensor.shape, tensor.dtype, tensor.device))
        held = self.hold(tensor) if self.hold is not None else []
        held = held[0] if held else None
        self.held.append(held is not None)
        return _Placeholder(self, len(self.meta) - 1, held)

    def end_forward(self):
        """After the forward region: nothing is left to compute when every saved tensor is held."""
        if self.hold is not None and all(self.held):
            self.invocation._handle.release_kept()
            # No recompute can follow: what only a recompute reads goes now (the RNG state is 5 KB on CPU).
            self.args = self.kwargs = self.cpu_rng = self.cuda_rng = self.fn = None

    def unpack(self, placeholder):
        if _compile.tracing():
            raise RuntimeError(
                "hpac: hpac.checkpoint's own frame cannot be traced by compiled autograd "
                "(torch._dynamo.compiled_autograd), which runs its recompute on traced tensors; checkpoint with "
                "torch.utils.checkpoint.checkpoint(fn, ..., use_reentrant=False, context_fn=hpac.context_fn(policy)) "
                "instead, which compiled autograd runs")
        if placeholder.held is not None:
            if placeholder.held._version == placeholder.version:
                return placeholder.held
            if self.invocation._handle.kept_released():
                raise RuntimeError(
                    f"hpac: checkpoint invocation {self.invocation.id}: saved tensor #{placeholder.index} "
                    f"({tuple(placeholder.held.shape)} {placeholder.held.dtype}) was modified by an in-place "
                    f"operation after the forward saved it for backward (version {placeholder.version}, now "
                    f"{placeholder.held._version}); autograd refuses this without a checkpoint too. Clone it before "
                    "writing to it, or write out of place.")
        with self.lock:
            if placeholder.index not in self.recomputed:
                self._recompute(placeholder.index)
            return self.recomputed.pop(placeholder.index)

    @contextlib.contextmanager
    def _forward_rng(self):
        if self.devices is None:
            yield
            return
        with torch.random.fork_rng(devices=self.devices):
            torch.set_rng_state(self.cpu_rng)
            for d, state in zip(self.devices, self.cuda_rng):
                torch.cuda.set_rng_state(state, d)
            yield

    def _recompute(self, wanted):
        unpack = self.unpack_input if self.unpack_input is not None else (lambda t: t)
        inputs = [unpack(a).detach().requires_grad_(rg) if is_tensor else a
                  for a, rg, is_tensor in zip(self.args, self.requires_grad, self.is_tensor)]
        collected = []
        # Note [The recompute stops early] (replay/checkpoint.cpp): after the last placeholder not held, or the one
        # asked for, nothing the function still runs is read by backward.
        stop_after = max([wanted] + [i for i, held in enumerate(self.held) if not held]) if self.early_stop else None

        stopped = []

        def pack(tensor):
            collected.append(tensor.detach())
            if stop_after is not None and len(collected) > stop_after:
                stopped.append(True)
                raise _StopRecompute()
            return None

        def unpack(_):
            raise RuntimeError("hpac: a tensor saved during a checkpoint recompute was unpacked")

        try:
            with self._forward_rng(), torch.enable_grad(), \
                    torch.autograd.graph.saved_tensors_hooks(pack, unpack), self.invocation.region("recompute"):
                self.fn(*inputs, **self.kwargs)
        except Exception:
            # torch 1.13 hands what a saved-tensor hook raised back as a RuntimeError: the flag says it was ours.
            if not stopped:
                raise
        if self.determinism_check:
            self._check(collected, stop_after)
        # Held tensors come from their placeholders; the recompute's aliases of them would only outlive those.
        self.recomputed = {i: t for i, t in enumerate(collected) if i == wanted or i >= len(self.held) or not self.held[i]}

    def _check(self, collected, stop_after):
        inv = self.invocation.id
        if len(collected) != len(self.meta) and (stop_after is None or len(collected) != stop_after + 1):
            raise RuntimeError(
                f"hpac: checkpoint invocation {inv} is not deterministic: the forward saved {len(self.meta)} "
                f"tensors for backward but the recompute saved {len(collected)}. The checkpointed function must run "
                "the same ops in backward as in forward.")
        for i, (t, (shape, dtype, device)) in enumerate(zip(collected, self.meta)):
            if t.shape != shape or t.dtype != dtype or t.device != device:
                raise RuntimeError(
                    f"hpac: checkpoint invocation {inv} is not deterministic: saved tensor #{i} was "
                    f"{tuple(shape)} {dtype} on {device} in forward but {tuple(t.shape)} {t.dtype} on {t.device} "
                    "in the recompute.")


def checkpoint(fn: Callable, *args: Any, policy: PolicyLike = "selective", use_reentrant: Optional[bool] = None,
               context_fn: Optional[Callable] = None, preserve_rng_state: bool = True,
               determinism_check: Union[str, bool] = "default", debug: bool = False, early_stop: bool = True,
               allow_cache_entry_mutation: bool = False, routing: str = "verify", state_writes: str = "warn",
               respect_saved_tensors_hooks: bool = True, allow_cache_mutation: Union[bool, None] = None,
               hold_saved: bool = True, **kwargs: Any) -> Any:
    """Non-reentrant checkpoint of fn(*args, **kwargs) with the policy run by hpac in C++.

    Works on torch 1.13 (no context_fn there): autograd's saved tensors become placeholders
    (torch.autograd.graph.saved_tensors_hooks); the first one unpacked in backward re-runs fn in the recompute
    phase with the forward's RNG state, and ops the policy saved are served from hpac's storage. Under no-grad
    fn runs plainly. While torch.compile traces it, the call is torch.utils.checkpoint.checkpoint(fn, ...,
    use_reentrant=False, context_fn=hpac.context_fn(policy)): the compiler recomputes what the policy marks.
    torch.utils.checkpoint's keywords are hpac's too, never fn's (Note [torch's keywords on hpac.checkpoint]).

    Args:
        fn: the function (or module) to checkpoint.
        *args: its positional arguments.
        policy: a kind name ("selective", "full", ...), a PolicySpec, a save list of op names, a Budget, or a
            policy function.
        use_reentrant: torch's; False or None (hpac's checkpoint is non-reentrant); True raises ValueError.
        context_fn: torch's; refused (ValueError): the policy is policy=.
        preserve_rng_state: the recompute runs with the forward's CPU and CUDA RNG states.
        determinism_check: "default" compares the number, shapes, dtypes and devices of the tensors autograd saved
            in forward and in the recompute; "none" does not (torch.utils.checkpoint's values; True / False too).
        debug: torch's; False. True raises ValueError naming hpac.explain, which shows each op's decision.
        early_stop: the recompute stops once it has every saved tensor the frame does not hold (Note [The
            recompute stops early]); False runs fn to the end (torch's set_checkpoint_early_stop(False)).
        allow_cache_entry_mutation: outputs kept for the recompute may be mutated in place afterwards (they are
            cloned when saved).
        routing, state_writes, respect_saved_tensors_hooks: the region's options (hpac.Invocation): MoE routing
            ops in the recompute ("verify", "save"), in-place writes there to tensors from outside the region
            ("warn", "error", "skip"), and whether the inputs and what the region keeps go through the
            saved_tensors_hooks around the call (save_on_cpu, offloading).
        allow_cache_mutation: the old name of allow_cache_entry_mutation.
        hold_saved: saved tensors that need no recompute (the policy keeps them, or fn did not make them: inputs,
            parameters) are held by the frame, and when every one is, backward does not re-run fn (a budget of 1.0,
            "save_all"; Note [Frames hold what needs no recompute]). False: every backward re-runs fn.
        **kwargs: fn's keyword arguments.

    Returns:
        fn's result.
    """
    _refuse_torch_only(use_reentrant, context_fn, debug)
    check = _determinism_check_on(determinism_check)
    allow = _cache_entry_mutation(allow_cache_entry_mutation, allow_cache_mutation)
    options = RegionOptions(routing, state_writes, respect_saved_tensors_hooks)
    return checkpoint_call(fn, args, kwargs, policy, options, allow_cache_entry_mutation=allow,
                           preserve_rng_state=preserve_rng_state, determinism_check=check, hold_saved=hold_saved,
                           early_stop=early_stop)


def checkpoint_call(fn: Callable, args: Sequence[Any], kwargs: Dict[str, Any], policy: PolicyLike,
                    options: RegionOptions, *, allow_cache_entry_mutation: bool = False,
                    preserve_rng_state: bool = True, determinism_check: bool = True, hold_saved: bool = True,
                    early_stop: bool = True) -> Any:
    """hpac.checkpoint's body: fn's arguments as a sequence and a dict, so that none is taken for a keyword of
    hpac's (checkpoint_wrapper passes a module's call through here), and the region options as one RegionOptions."""
    if _compile.dynamo_tracing():
        return torch.utils.checkpoint.checkpoint(
            fn, *args, use_reentrant=False, preserve_rng_state=preserve_rng_state,
            determinism_check="default" if determinism_check else "none",
            context_fn=region_context_fn(policy, allow_cache_entry_mutation, options), **kwargs)
    if not torch.is_grad_enabled():
        return fn(*args, **kwargs)
    inv = new_invocation(policy, allow_cache_entry_mutation, options)
    owner = fn if isinstance(fn, torch.nn.Module) else getattr(fn, "__self__", None)
    if isinstance(owner, torch.nn.Module):
        inv.name_state(owner)  # messages name the buffer a recompute writes again (Note [State written twice])
    return _run_frame(inv, fn, args, kwargs, preserve_rng_state, determinism_check,
                      options.respect_saved_tensors_hooks, hold_saved, early_stop)


def checkpoint_with(invocation, fn: Callable, *args: Any, preserve_rng_state: bool = True,
                    determinism_check: Union[str, bool] = "default", _inputs_through_hooks: bool = True,
                    hold_saved: bool = True, early_stop: bool = True, **kwargs: Any) -> Any:
    """hpac.checkpoint's machinery around any invocation-like object: one with `.id` and a context manager
    `.region(phase)` for phase 'forward' / 'recompute' (benchmarks plug a Python dispatch mode in here; not API:
    hpac.harness.checkpoint_with)."""
    return _run_frame(invocation, fn, args, kwargs, preserve_rng_state, _determinism_check_on(determinism_check),
                      _inputs_through_hooks, hold_saved, early_stop)


def _run_frame(invocation, fn: Callable, args: Sequence[Any], kwargs: Dict[str, Any], preserve_rng_state: bool,
               determinism_check: bool, inputs_through_hooks: bool, hold_saved: bool, early_stop: bool) -> Any:
    if not torch.is_grad_enabled():
        return fn(*args, **kwargs)
    # torch >= 2.0 says which hooks are around the call (1.13 cannot: the frame holds its inputs itself there).
    outer = _TOP_HOOKS(False) if _TOP_HOOKS is not None and inputs_through_hooks else None
    frame = _Frame(fn, args, kwargs, invocation, preserve_rng_state, determinism_check, outer, hold_saved, early_stop)
    with torch.autograd.graph.saved_tensors_hooks(frame.pack, frame.unpack), frame.forward_region:
        out = fn(*args, **kwargs)
    frame.end_forward()
    return out
