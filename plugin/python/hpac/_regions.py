"""Regions: one checkpoint call's C++ Invocation and its forward / recompute contexts, and context_fn for
torch.utils.checkpoint. Under torch.compile the contexts are PyTorch's selective checkpoint modes driven by the same
C++ policy (_compile.py)."""
import functools
import inspect
import itertools
import weakref
from typing import Any, Callable, Dict, Iterable, List, Optional, Sequence, Tuple, Union

import torch
import torch.utils.checkpoint

from . import _compile, _policy_fn
from ._budget import Budget
from ._field_policies import PolicySpec, policy_kind
from ._region_options import RegionOptions

# A policy as hpac's Python API takes it: a kind name ("selective", "full", "save_all", "torchtitan"; parsed in C++,
# policy/policy_kind.h), a PolicySpec (a kind with parameters), None (= "full"), a save list (op names, OpOverloads,
# OpOverloadPackets), a Budget, or a policy function policy_fn(ctx, op, *args, **kwargs) as torch's selective
# checkpointing takes it (_policy_fn.py).
PolicyLike = Union[str, PolicySpec, None, Sequence, Budget, Callable]


def _cache_entry_mutation(allow_cache_entry_mutation: bool, allow_cache_mutation: Optional[bool]) -> bool:
    """torch's spelling, allow_cache_entry_mutation, with hpac's earlier allow_cache_mutation kept as an alias."""
    if allow_cache_mutation is None:
        return bool(allow_cache_entry_mutation)
    if allow_cache_entry_mutation:
        raise ValueError("hpac: give allow_cache_entry_mutation (torch's name) or its old alias allow_cache_mutation, "
                         "not both")
    return bool(allow_cache_mutation)


class _Region:
    """Context manager for one phase of an Invocation. Re-enterable: torch.utils.checkpoint enters the same
    recompute context again when a graph is backwarded twice (retain_graph); hpac then reports the entries
    already served.

    `note_saved` is set while a forward region reports what autograd saves and torch cannot wrap the checkpoint's
    own hooks (torch 1.13): hpac's own checkpoint frame then calls it from its pack hook (_frame.py)."""

    __slots__ = ("_invocation", "_phase", "_reporting", "_mode", "note_saved")

    def __init__(self, invocation: "Invocation", phase: str):
        self._invocation = invocation
        self._phase = phase
        self._reporting = None
        self._mode = None
        self.note_saved = None

    def __enter__(self) -> "Invocation":
        handle = self._invocation._handle
        torch_says = getattr(self, "respect_saved_tensors_hooks", None)  # Note [torch's respect_saved_tensors_hooks]
        if torch_says is not None:
            handle.respect_saved_tensors_hooks(bool(torch_says))
        # A policy function decides the forward's ops (Note [Decided after the op]); outer dispatch modes around a
        # recompute see only the ops that run (Note [Outer dispatch modes see what ran]), both in _policy_fn.py.
        if self._phase == "forward" and self._invocation._policy_fn is not None:
            self._mode = _policy_fn._PolicyFnMode(self._invocation._policy_fn, self._invocation)
        # Note [One mode state in both phases]: a policy function's recompute runs under a mode too. torch's
        # composite ops decompose by whether a dispatch mode is active (reshape becomes view under one and
        # _reshape_alias without), so a forward under _PolicyFnMode and a bare recompute met different op sequences
        # ("aten::_reshape_alias ... is not in storage" on any reshape ahead of a saved op, e.g. every transformers
        # Qwen3-MoE layer). Neither mode asks the policy; each costs one Python call per recompute op, and with no
        # outer mode to hide served ops from, _ModeStateMode only passes each op on.
        elif self._phase == "recompute" and _policy_fn.outer_modes_active():
            self._mode = _policy_fn._ServedOpsMode(self._invocation)
        elif self._phase == "recompute" and self._invocation._policy_fn is not None:
            self._mode = _policy_fn._ModeStateMode()
        handle.enter(self._phase)
        if self._phase == "forward" and handle.watches_saved():
            self._reporting = self._report_saved(handle)
        if self._mode is not None:
            self._mode.__enter__()
        return self._invocation

    def __exit__(self, exc_type, exc, tb):
        if self._mode is not None:
            mode, self._mode = self._mode, None
            mode.__exit__(exc_type, exc, tb)
        if self._reporting is not None:
            reporting, self._reporting = self._reporting, None
            reporting()
        # An exception (torch's early stop of a recompute, an error) ends the phase unfinished: hpac then
        # releases saved outputs the recompute never asked for without warning about them.
        self._invocation._handle.exit(exc_type is None)
        return False

    def _report_saved(self, handle) -> Callable[[], None]:
        """While a budget profile's forward, or one that may skip ops, runs: every tensor autograd saves is
        reported to hpac (Note [What off keeps], policy/budget_plan.h; Note [Skips are verified],
        replay/dead_ops.cpp), then handed to the checkpoint's own pack hook. Returns the function that stops
        reporting. Where torch can say which hooks are on top (>= 2.0: torch.utils.checkpoint's, or
        hpac.checkpoint's frame), they are wrapped; on 1.13 the frame reports through `note_saved`."""
        if _TOP_HOOKS is None:
            self.note_saved = handle.note_saved

            def stop():
                self.note_saved = None
            return stop
        top = _TOP_HOOKS(False)
        pack, unpack = top if top is not None else (lambda t: t, lambda t: t)

        def report(tensor):
            for t in _plain_tensors(tensor):
                handle.note_saved(t)
            return pack(tensor)

        hooks = torch.autograd.graph.saved_tensors_hooks(report, unpack)
        hooks.__enter__()
        return lambda: hooks.__exit__(None, None, None)


_TOP_HOOKS = getattr(torch._C._autograd, "_top_saved_tensors_default_hooks", None)  # torch >= 2.0

# Note [torch's respect_saved_tensors_hooks]
# torch >= 2.14's checkpoint(..., respect_saved_tensors_hooks=True|False) tells its SAC whether what SAC keeps goes
# through the user's saved_tensors_hooks (save_on_cpu): it sets the attribute on the forward context when that context
# is a _CachingTorchDispatchMode, before entering it. hpac's forward region is one such instance by type (it is never
# pushed as a dispatch mode: its __enter__ is _Region's), so it receives torch's argument and hands it to C++
# (Invocation::respectSavedTensorsHooks); None, torch's default, leaves hpac's own respect_saved_tensors_hooks (True
# unless set otherwise: hpac routes what it keeps through the hooks).
_TORCH_CACHING_MODE = getattr(torch.utils.checkpoint, "_CachingTorchDispatchMode", None)
if _TORCH_CACHING_MODE is not None and "respect_saved_tensors_hooks" in inspect.signature(
        torch.utils.checkpoint.checkpoint).parameters:

    class _ForwardRegion(_Region, _TORCH_CACHING_MODE):
        __init__ = _Region.__init__
else:
    _ForwardRegion = _Region


def _plain_tensors(tensor) -> List[torch.Tensor]:
    """The plain tensors a saved tensor holds its values in.

    Note [Saved wrapper subclasses]
    Autograd saves what the op it records saw: above a wrapper subclass's __torch_dispatch__ (DTensor under
    tensor parallelism, the AsyncCollectiveTensor of a functional collective), that is the wrapper, whose own
    storage holds nothing; hpac's fallback, below the Python key, sees only the plain tensors inside. So a
    DTensor's local tensor, saved by the linear that reads it, was not in what the recompute must produce, the
    op that made it was skipped (Note [Dead ops are skipped]) and the weight's gradient read a scratch buffer
    (measured: |dgrad| 1e+22..1e+35 on tp 2 with mode budget). A wrapper is reported by its inner tensors
    (__tensor_flatten__, recursively), the storages hpac saw."""
    flatten = getattr(type(tensor), "__tensor_flatten__", None)
    if flatten is None or not isinstance(tensor, torch.Tensor) or type(tensor) is torch.Tensor:
        return [tensor]
    names, _ = tensor.__tensor_flatten__()
    inner = [getattr(tensor, name) for name in names]
    return [t for x in inner if isinstance(x, torch.Tensor) for t in _plain_tensors(x)]


ROUTING_RULES = ("verify", "save")
STATE_WRITE_RULES = ("warn", "error", "skip")


class Invocation:
    """One checkpoint call: the C++ Invocation (op counters, storage, stats) and its two regions.

    Args:
        policy: a kind name ("selective", "full", ...), a save list (op names, OpOverloads, OpOverloadPackets), a
            Budget, or a policy function policy_fn(ctx, op, *args, **kwargs) as torch's SAC takes it (asked once
            per op in the forward; Note [Decided after the op], policy/checkpoint_policy.h).
        allow_cache_entry_mutation: outputs kept for the recompute may be mutated in place after the region (they
            are cloned when saved); otherwise such a mutation is an error in backward.
        record_ops: keep a log of every op the fallback handed to it (op_log()), for tests and explain tools.
        explain: record each decision with its reason for hpac.explain.
        routing: "verify" (routing ops such as topk are recomputed and must decide as in the forward, else backward
            stops naming the op) or "save" (they are saved; Note [Routing is verified], replay/routing_check.h).
        state_writes: what the recompute does with in-place writes to tensors from outside the region (module
            buffers, counters): "warn", "error" or "skip" (made once, in the forward; Note [State written twice]).
        respect_saved_tensors_hooks: what the region keeps goes through the saved_tensors_hooks around it
            (save_on_cpu, offloading; Note [Outer saved-tensor hooks]); False bypasses them, as torch's SAC does.
        allow_cache_mutation: the old name of allow_cache_entry_mutation.
    """

    def __init__(self, policy: PolicyLike = "selective", allow_cache_entry_mutation: bool = False,
                 record_ops: bool = False, explain: bool = False, *, routing: str = "verify",
                 state_writes: str = "warn", respect_saved_tensors_hooks: bool = True,
                 allow_cache_mutation: Optional[bool] = None):
        allow = _cache_entry_mutation(allow_cache_entry_mutation, allow_cache_mutation)
        options = RegionOptions(routing, state_writes, respect_saved_tensors_hooks)
        self._policy_fn = None
        if callable(policy) and not isinstance(policy, (str, Budget)):
            _policy_fn.require_modes("a policy function")
            self._policy_fn = policy
        if isinstance(policy, Budget):
            self._handle = policy._invocation(allow, options)
        else:
            kind, names = policy_kind(policy)
            self._handle = torch.classes.hpac.Invocation(kind, names, allow, *options.flat())
        if record_ops:
            self._handle.record_ops(True)
        if explain:
            self._handle.explain()

    @property
    def id(self) -> int:
        return self._handle.id()

    def stats(self) -> Dict[str, int]:
        return dict(self._handle.stats())

    def stored_entries(self) -> int:
        return self._handle.stored_entries()

    def op_log(self) -> List[str]:
        """['forward aten::mm saved', 'recompute aten::mm served', ...] when created with record_ops=True."""
        return list(self._handle.op_log())

    def name_state(self, module: torch.nn.Module, prefix: str = "") -> None:
        """Names module's buffers and parameters in the messages about writes to them in the recompute (Note
        [State written twice]): 'gate.expert_load' instead of a tensor from outside the region."""
        named = list(module.named_buffers(prefix=prefix)) + list(module.named_parameters(prefix=prefix))
        self._handle.name_state([t for _, t in named], [n for n, _ in named])

    def region(self, phase: str) -> _Region:
        """Every aten op run inside goes through hpac (phase: 'forward' or 'recompute')."""
        return (_ForwardRegion if phase == "forward" else _Region)(self, phase)


def new_invocation(policy: PolicyLike, allow_cache_entry_mutation: bool, options: RegionOptions,
                   record_ops: bool = False) -> Invocation:
    """Invocation(...) with its three region options given as one RegionOptions (hpac's own callers)."""
    return Invocation(policy, allow_cache_entry_mutation, record_ops, routing=options.routing,
                      state_writes=options.state_writes,
                      respect_saved_tensors_hooks=options.respect_saved_tensors_hooks)


def check_region(policy: PolicyLike, options: RegionOptions) -> None:
    """Checks a policy and the region options in C++ now, where the caller names them, not inside backward: an
    unknown kind or option raises RuntimeError naming it and what is allowed. A Budget was checked when made."""
    kind, names = policy_kind(policy) if not isinstance(policy, Budget) else ("full", [])
    torch.classes.hpac.Invocation(kind, names, False, *options.flat())


# Note [context_fn under torch.compile]
# Dynamo accepts a context_fn only as a functools.partial whose arguments it can turn into constants, and it guards
# the compiled graph on them. So the partial context_fn returns holds constants only: the policy as a key (a kind
# name, ("save_list", names), or ("budget", n) for Budget n) and the number of the partial itself when it has an
# on_invocation hook; the Budget and the hook are attributes of the partial, found here by number through weak
# references (Note [Nothing outlives its model]). Equal constants mean one compiled graph for every layer
# checkpointed alike; a Budget reaches _make_contexts inside AOTAutograd's trace, where it is refused with a message
# (a hard error, never a silent eager fallback).
#
# Note [Nothing outlives its model]
# hpac keeps no strong reference from process-wide state to what a user made: a module-level registry holds weak
# references only (_CONTEXT_FNS here, Budget._live), so a wrapped model, its layers, parameters and Budgets go with
# the last reference the user holds (a cycle through the module's wrapped forward is collected by gc). A region's
# saved outputs belong to its C++ Invocation, which belongs to the checkpoint frame, which belongs to the autograd
# graph: dropping the graph, with or without backward, frees them. Per-layer statistics are counters
# (InvocationTally), never a list of invocations. docs/reliability.md, "Memory across a run", says what is
# guaranteed; test/python/test_lifetimes.py checks it.
_hook_numbers = itertools.count(1)
# context_fn partials with an on_invocation hook, by number, while the partial lives (weakly: the partial holds the
# hook, and the hook often its layer).
_CONTEXT_FNS: "weakref.WeakValueDictionary[int, functools.partial]" = weakref.WeakValueDictionary()


class InvocationTally:
    """Bounded counters of a region's invocations: hpac.Invocation.stats() summed, and with record_ops their op-log
    lines counted ("log:<phase> <op> <action>"); hpac.hf's per-layer stats. Each invocation's work is added once:
    its progress so far when take() runs, the rest when it is freed with its graph. The tally holds no invocation
    (only weak references), so its memory does not grow with the number of calls (Note [Nothing outlives its
    model]).

        tally = hpac.InvocationTally()
        ctx = hpac.context_fn("selective", on_invocation=tally.watch)
        ...forward, backward...
        tally.take()   # {'saved': ..., 'served': ..., ..., 'invocations': calls since the last take}
    """

    __slots__ = ("_total", "_calls", "_taken", "_alive", "__weakref__")

    def __init__(self):
        self._total: Dict[str, int] = {}
        self._calls = 0
        # per invocation not yet freed (by its id): what was already added [stats dict, op-log lines]
        self._taken: Dict[int, list] = {}
        self._alive: "weakref.WeakValueDictionary[int, Invocation]" = weakref.WeakValueDictionary()

    def watch(self, inv: "Invocation") -> None:
        """Counts `inv`'s work (an on_invocation hook); added as take() reads it and when it is freed."""
        self._calls += 1
        self._taken[inv.id] = [{}, 0]
        self._alive[inv.id] = inv
        weakref.finalize(inv, InvocationTally._finished, weakref.ref(self), inv.id, inv._handle)

    @staticmethod
    def _finished(tally_ref, number, handle) -> None:
        tally = tally_ref()
        if tally is not None:
            tally._add(number, handle)
            tally._taken.pop(number, None)

    def _add(self, number: int, handle) -> None:
        taken = self._taken.get(number)
        if taken is None:
            return
        total = self._total
        stats = dict(handle.stats())
        for k, v in stats.items():
            total[k] = total.get(k, 0) + v - taken[0].get(k, 0)
        log = handle.op_log()
        for line in log[taken[1]:]:
            total["log:" + line] = total.get("log:" + line, 0) + 1
        taken[0], taken[1] = stats, len(log)

    def take(self) -> Dict[str, int]:
        """The counters since the last take, then zero ('invocations': the calls watched). An invocation whose
        graph is still alive adds its progress so far; the rest comes with a later take."""
        for inv in list(self._alive.values()):
            self._add(inv.id, inv._handle)
        total, self._total = self._total, {}
        total["invocations"], self._calls = self._calls, 0
        return total

    @property
    def live(self) -> int:
        """Watched invocations not yet freed (their graphs are alive)."""
        return len(self._taken)


def _policy_key(policy: PolicyLike):
    if isinstance(policy, Budget):
        return ("budget", policy._number)
    kind, names = policy_kind(policy)
    if kind == "policy_fn":
        return ("policy_fn", policy)  # a function is a constant Dynamo can guard on, as in torch's own partial
    if kind == "save_list":
        return ("save_list", tuple(names))
    return ("spec", kind, tuple(names)) if names else kind


def _policy_of(key) -> PolicyLike:
    if isinstance(key, str):
        return key
    if key[0] == "budget":
        return Budget._by_number(key[1])
    if key[0] == "policy_fn":
        return key[1]
    if key[0] == "spec":
        return PolicySpec(key[1], key[2])
    return list(key[1])


def _make_contexts(policy_key, allow_cache_entry_mutation: bool, record_ops: bool, hook: Optional[int],
                   options: Tuple[str, str, bool] = RegionOptions().flat()):
    """context_fn's body, per checkpoint call: hpac's two regions of a new Invocation, or, while torch.compile
    traces the call, PyTorch's selective checkpoint modes asking the same policy (_compile.traced_contexts).
    options: RegionOptions.flat(), as the partial holds it."""
    policy = _policy_of(policy_key)
    region_options = RegionOptions(*options)
    if _compile.tracing():
        return _compile.traced_contexts(policy, allow_cache_entry_mutation, routing=region_options.routing)
    inv = new_invocation(policy, allow_cache_entry_mutation, region_options, record_ops)
    made = _CONTEXT_FNS.get(hook) if hook is not None else None
    if made is not None:
        made.on_invocation(inv)
    return inv.region("forward"), inv.region("recompute")


def context_fn(policy: PolicyLike = "selective", allow_cache_entry_mutation: bool = False, *,
               on_invocation: Optional[Callable[[Invocation], None]] = None, record_ops: bool = False,
               routing: str = "verify", state_writes: str = "warn", respect_saved_tensors_hooks: bool = True,
               allow_cache_mutation: Optional[bool] = None) -> Callable[[], tuple]:
    """For torch.utils.checkpoint.checkpoint(..., use_reentrant=False, context_fn=...) on torch >= 2.1.

    Per checkpoint call, creates one Invocation and returns its (forward, recompute) context managers; with a
    Budget, every call shares its region (profile once, then replay the plan). Under torch.compile the same call
    returns PyTorch's selective checkpoint modes, whose policy asks hpac's C++ policy for each traced op (a Budget
    there is an error naming torch.compile's own budget; on_invocation is not called: no eager invocation runs).

    Args:
        policy: a kind name ("selective", "full"), a save list (op names, OpOverloads, OpOverloadPackets), a Budget,
            or a policy function policy_fn(ctx, op, *args, **kwargs) returning a CheckpointPolicy or a bool.
        allow_cache_entry_mutation: as torch's create_selective_checkpoint_contexts.
        on_invocation: called with each eager call's Invocation (to read its stats after backward).
        record_ops: each eager Invocation keeps its op log.
        routing, state_writes, respect_saved_tensors_hooks: as Invocation's.
        allow_cache_mutation: the old name of allow_cache_entry_mutation.

    Returns:
        A functools.partial over constants (Note [context_fn under torch.compile]), as torch.compile requires:
        equal policies give equal partials, so layers checkpointed alike compile once.
    """
    allow = _cache_entry_mutation(allow_cache_entry_mutation, allow_cache_mutation)
    options = RegionOptions(routing, state_writes, respect_saved_tensors_hooks)
    return region_context_fn(policy, allow, options, on_invocation=on_invocation, record_ops=record_ops)


def region_context_fn(policy: PolicyLike, allow_cache_entry_mutation: bool, options: RegionOptions, *,
                      on_invocation: Optional[Callable[[Invocation], None]] = None,
                      record_ops: bool = False) -> Callable[[], tuple]:
    """context_fn(...) with its region options given as one RegionOptions (hpac.checkpoint under torch.compile,
    hpac.hf's layers). The options are flattened into the partial: Dynamo takes constants only."""
    key = _policy_key(policy)
    if not _compile.dynamo_tracing():
        check_region(policy, options)
    number = None
    if on_invocation is not None and not _compile.dynamo_tracing():  # compiled code runs no eager invocation
        number = next(_hook_numbers)
    made = functools.partial(_make_contexts, key, bool(allow_cache_entry_mutation), bool(record_ops), number,
                             options.flat())
    if number is not None:
        made.on_invocation = on_invocation  # found by number, weakly (Note [Nothing outlives its model])
        _CONTEXT_FNS[number] = made
    if isinstance(policy, Budget):
        made.budget = policy  # the partial holds its number; this keeps the region alive as long as the partial
    return made


def create_selective_checkpoint_contexts(policy_fn_or_list: _policy_fn.PolicyFnOrList,
                                         allow_cache_entry_mutation: bool = False):
    """torch.utils.checkpoint.create_selective_checkpoint_contexts, run by hpac.

    Args:
        policy_fn_or_list: a function `policy_fn(ctx, op, *args, **kwargs)` returning a
            torch.utils.checkpoint.CheckpointPolicy or a bool, asked once per op in the forward after the op ran;
            or a list of ops to save (OpOverloads, OpOverloadPackets, higher-order operators, or hpac's op names),
            every other op PREFER_RECOMPUTE.
        allow_cache_entry_mutation: as torch's; without it hpac copies a kept output on the first in-place write
            inside the region and raises for writes after it (docs/python.md, "From PyTorch's SAC").

    Returns:
        (forward context, recompute context) for torch.utils.checkpoint.checkpoint's context_fn; under torch.compile,
        PyTorch's selective checkpoint modes asking the same policy.
    """
    if isinstance(policy_fn_or_list, (list, tuple)):
        policy: Any = _policy_fn.save_list_names(policy_fn_or_list)
        if _compile.tracing():
            return _compile.traced_contexts(policy, allow_cache_entry_mutation)
    elif callable(policy_fn_or_list):
        policy = policy_fn_or_list
        if _compile.tracing():
            return torch.utils.checkpoint.create_selective_checkpoint_contexts(
                _policy_fn.checked_policy_fn(policy), allow_cache_entry_mutation)
    else:
        raise TypeError(f"hpac: policy_fn_or_list must be a function or a list of ops, got "
                        f"{type(policy_fn_or_list).__name__}")
    invocation = Invocation(policy, allow_cache_entry_mutation)
    return invocation.region("forward"), invocation.region("recompute")
