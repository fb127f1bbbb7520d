"""Fit a training step into the bytes you name: a whole-step memory target (docs/python.md, "Fit a step into N
bytes"; the model and the solver: Note [The step's peak as events] and Note [An exact step plan], policy/step_plan.h).

    hpac.track_memory()                                  # on CPU, before the model is built
    model = build()
    target = hpac.fit_memory_target(model, model.layers, "8GiB")
    for batch in data: loss = model(batch); loss.backward(); opt.step(); opt.zero_grad()
    target.report()                                      # target, predicted and measured peak, what set it, the plan

Step 1 profiles: every layer is a budget region recomputing everything (the least it can keep), and the step's
live bytes are read at each boundary (a layer's forward, what follows the layers, each layer's backward, the rest:
embedding backward and optimizer step). At the start of step 2 the bases of those events are known (with the
optimizer state step 1 created), each layer's candidate plans come from its profile (what it keeps and what its
recompute costs at 0 to 100% of what it keeps under off, or not checkpointed at all), and the exact planner picks
one per layer: every event under the target at the least predicted recompute time. Every later step is measured
against its prediction; an event over its prediction raises that event's base (and a measured peak over the target
is a warning with the numbers), and the plan is made again for the next step.
"""
import functools
import json
import re
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple, Union

import torch

from ._budget import Budget, budget as make_budget
from ._wrap import unwrap_checkpoint, wrap_forward

_UNITS = {"B": 1, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30}
_ALLOWED = ("allowed: the most tensor bytes one rank may hold during a step, > 0: an int, or a number with a unit: "
            "B, KiB, MiB or GiB ('70GiB')")


class MemoryTargetError(ValueError):
    """The target cannot be met (below the floor) or is malformed; raised before the step it would concern runs."""


def parse_bytes(value: Union[int, str], what: str = "memory target") -> int:
    """Bytes from an int or a size with a unit ('70GiB', '512MiB'); ValueError naming the value and what is allowed."""
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        raise MemoryTargetError(f"hpac: {what} {value!r} is a {type(value).__name__}; {_ALLOWED}")
    if isinstance(value, int):
        n = value
    else:
        m = re.fullmatch(r"([0-9]+(?:\.[0-9]*)?)(B|KiB|MiB|GiB)", value.strip())
        if m is None:
            raise MemoryTargetError(f"hpac: {what} {value!r} is not a size; {_ALLOWED}")
        n = int(float(m.group(1)) * _UNITS[m.group(2)])
    if n <= 0:
        raise MemoryTargetError(f"hpac: {what} {value!r} is not above zero; {_ALLOWED}")
    return n


class _Meter:
    """The live tensor bytes of the step's device and their peak since the last read."""

    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"
        if not self.cuda and device.type not in ("cpu", "meta"):
            raise MemoryTargetError(f"hpac: a memory target measures CPU (hpac's tracking allocator), meta (the same "
                                    f"counters: hpac.plan) or CUDA (the caching allocator) tensors; the model is on "
                                    f"{device}")
        if device.type == "meta" and not torch.ops.hpac.meta_memory_tracked():
            raise MemoryTargetError("hpac: a memory target on the meta device counts meta tensors' bytes: call "
                                    "torch.ops.hpac.track_meta_memory() before the model is built (hpac.plan does)")
        if device.type == "cpu" and not torch.ops.hpac.memory_tracked():
            raise MemoryTargetError("hpac: a memory target on CPU reads hpac's tracking allocator: call "
                                    "hpac.track_memory() before the model is built (it counts only what is "
                                    "allocated after)")
        self.device = device
        self._fragmentation = 0  # on CUDA: the step's largest reserved-beyond-allocated, over its events

    def current(self) -> int:
        if self.cuda:
            return torch.cuda.memory_allocated(self.device)
        return torch.ops.hpac.memory_stats()["current_bytes"]

    def take_peak(self) -> int:
        """The peak since the last take; the next one starts from now. On CUDA this resets torch's peak counters
        (torch.cuda.reset_peak_memory_stats): the caching allocator keeps one peak."""
        if self.cuda:
            peak = torch.cuda.max_memory_allocated(self.device)
            self._fragmentation = max(self._fragmentation, torch.cuda.max_memory_reserved(self.device) - peak)
            torch.cuda.reset_peak_memory_stats(self.device)
            return peak
        return torch.ops.hpac.take_event_peak()  # apart from memory_stats' peak, which the caller may reset

    def take_fragmentation(self) -> int:
        """On CUDA, the most the caching allocator held beyond the live tensors at an event's peak since the last
        take (it counts against the device); 0 on CPU."""
        out, self._fragmentation = self._fragmentation, 0
        return max(0, out)


# An event of the step (Note [The step's peak as events]): (what, layers whose kept bytes count, own layer or -1).
Event = Tuple[str, int, int]


@dataclass
class LayerPlan:
    """One layer's part of the plan: 'off' (not checkpointed) or the budget its region replays."""
    path: str
    checkpointed: bool = True
    budget_bytes: int = 0
    kept_bytes: int = 0
    backward_bytes: int = 0
    off_bytes: int = 0
    recompute_micros: float = 0.0
    forward_bytes: int = 0  # what its forward holds at its highest moment (Note [A forward, op by op])


@dataclass(eq=False)
class _Layer:
    path: str
    module: torch.nn.Module
    budget: Budget
    checkpointed_call: Callable[..., Any]  # checkpointed_call(original, *args, **kwargs)
    checkpointed: bool = True  # what the plan says (every layer is, in the profile step)


def _first_tensor(values) -> Optional[torch.Tensor]:
    for v in values:
        if isinstance(v, torch.Tensor):
            return v
        if isinstance(v, (tuple, list)):
            t = _first_tensor(v)
            if t is not None:
                return t
    return None


class MemoryTarget:
    """A whole-step memory target over `layers` of `model` (made by fit_memory_target or hpac.hf.prepare): the
    front-end of policy/step_target.h (torch.classes.hpac.StepTarget), which keeps the events, plans and reports.
    Here: the boundaries (a forward pre-hook on the model, the layers' wrappers, tensor hooks for the backward), the
    live bytes, and the agreement of several ranks (Note [One step plan for every rank])."""

    def __init__(self, model: torch.nn.Module, layers: Sequence[Tuple[str, torch.nn.Module, Budget, Callable]],
                 target_bytes: int, log: Optional[Callable[[str, str], None]] = None, group: Any = None,
                 view: Any = None, measure_only: bool = False):
        self.target_bytes = target_bytes
        self._group = group
        self.model = model
        self._meter: Optional[_Meter] = None  # the parameters' device, at the first step (the model may move)
        # hpac.plan (Note [One rank of a sharded step], _plan.py): what one rank of a sharded job would hold, from the
        # meta device's bytes; view.start(live), view.opened(event), view.peak(event, peak). None: the bytes as read.
        self._view = view
        # Events measured, never planned: every layer runs its checkpointed_call as given (None: not checkpointed).
        self._measure_only = measure_only
        self._optimizer_hooks: list = []
        self._since_optimizer = 0  # steps begun since the watched optimizer's last step
        self._rest_open = False    # "the rest" opened this step (layer 0's input gradient, or the optimizer)
        local = [getattr(p, "_local_tensor", p) for p in model.parameters()]  # a DTensor's shard on this rank
        params = sum(t.numel() * t.element_size() for t in local)
        grads = sum(t.numel() * t.element_size() for t, p in zip(local, model.parameters()) if p.requires_grad)
        if view is not None:
            params, grads = view.sharded(params), view.sharded(grads)
        self._target = torch.classes.hpac.StepTarget(target_bytes, params, grads)
        self._watching = False
        self._layers = [_Layer(path, module, b, call, call is not None) for path, module, b, call in layers]
        for i, layer in enumerate(self._layers):
            self._target.add_layer(layer.path, layer.budget._region)
            wrap_forward(layer.module, functools.partial(_TargetCall.call, _TargetCall(self, i)))
        self._log = log
        self._hook = model.register_forward_pre_hook(self._step_begin)
        self._event: Optional[Event] = None  # the event open now
        self.error: Optional[MemoryTargetError] = None

    # --- measuring -------------------------------------------------------------------------------------------
    def _mark(self, event: Optional[Event]) -> None:
        """Closes the event open now (its peak) and opens `event`."""
        if self._meter is None:
            return
        if event is not None and event[0] == "the rest":
            self._rest_open = True
        peak = self._meter.take_peak()
        if self._view is not None:
            peak = self._view.peak(self._event, peak)
        if self._event is not None:
            self._target.record(self._event[0], self._event[1], self._event[2], peak)
        self._event = event
        if self._view is not None and event is not None:
            self._view.opened(event)

    def _say(self, messages) -> None:
        for warning, text in zip(*messages):
            if self._log is not None:
                self._log("warning" if warning else "info", text)

    def _step_begin(self, module, args) -> None:
        if not torch.is_grad_enabled():
            return
        if self._meter is None:
            param = next(self.model.parameters(), None)
            self._meter = _Meter(param.device if param is not None else torch.device("cpu"))
        if self._watching and self._since_optimizer and self.error is None:
            self.error = MemoryTargetError(
                "hpac: memory target: the model was called again without optimizer.step() between (gradient "
                "accumulation): the target plans one model call per optimizer step; call it once per step, or "
                "make the target without optimizer= (each call is then planned as a step of its own)")
        self._since_optimizer += 1
        self._close_step()
        if self.error is not None:
            raise self.error
        t = self._target
        if t.planned_at():
            self._agree_bases()
        live = self._meter.current()
        t.start_step(live if self._view is None else self._view.start(live))
        self._rest_open = False
        if self._measure_only:
            pass
        elif t.wants_first_plan():
            if all(self._gather(t.regions_ready())):  # else a layer has not finished its profile: next step
                t.prepare_first_plan()
                self._agree_bases()
                self._agree_candidates()
                self._plan("")
        elif t.planned_at() and t.needs_replan():
            self._plan("a step's measured peak went over its prediction")
        self._mark(("before the layers", 0, -1))

    def _close_step(self) -> None:
        self._mark(None)
        t = self._target
        self._say(t.finish_step(self._meter.take_fragmentation() if self._meter else 0))
        if t.error() and self.error is None:
            self.error = MemoryTargetError(t.error())

    def _plan(self, why: str) -> None:
        self._say(self._target.plan(why))
        for layer, checkpointed in zip(self._layers, self._target.checkpointed()):
            layer.checkpointed = bool(checkpointed)
        if self._target.error():
            self.error = MemoryTargetError(self._target.error())
            raise self.error

    def _layer_begin(self, i: int, args, kwargs) -> None:
        if not torch.is_grad_enabled():
            return
        self._target.layer_called(i)
        self._mark((f"forward of layer {i}", i + 1, i))
        if i == 0:
            x = _first_tensor(list(args) + list(kwargs.values()))
            if x is not None and x.requires_grad:
                x.register_hook(functools.partial(_TargetCall.backward_mark, self, ("the rest", 0, -1)))

    def _layer_end(self, i: int, out) -> None:
        if not torch.is_grad_enabled():
            return
        last = i == len(self._layers) - 1
        self._mark(("after the layers" if last else f"after layer {i}", i + 1, -1))
        y = _first_tensor([out])
        if y is not None and y.requires_grad:
            y.register_hook(functools.partial(_TargetCall.backward_mark, self, (f"backward of layer {i}", i, i)))

    # Note [One step plan for every rank]
    # Under FSDP2 (or any data-parallel job) every rank runs its own MemoryTarget. Each measures its own events
    # (what a rank holds differs a little: its batch, its MoE routing) and profiles its own recompute times, so
    # planning alone, the ranks could choose different plans, and replan at different steps. Planning instead
    # from one problem for every rank — per event the largest base any rank measured, per candidate the largest
    # kept bytes of any rank and rank 0's recompute time — gives every rank the same choice (the solver is
    # deterministic), fitting the rank that holds the most; every later calibration takes the largest again, so
    # the ranks replan together. Each rank applies the choice to its own regions (budget k/16 of its own off
    # bytes). Collective (all_gather_object over `group`) at step 2's start and at every later step's start.
    def _world(self):
        import torch.distributed as dist
        if dist.is_available() and dist.is_initialized() and dist.get_world_size(self._group) > 1:
            return dist
        return None

    def _gather(self, value) -> list:
        dist = self._world()
        if dist is None:
            return [value]
        everyone = [None] * dist.get_world_size(self._group)
        dist.all_gather_object(everyone, value, group=self._group)
        return everyone

    def _agree_bases(self) -> None:
        if self._world() is None:
            return
        merged: Dict[Event, int] = {}
        everyone = self._gather(([list(x) for x in self._target.bases()], self._target.margin()))
        for (what, kept, layer, base), _ in everyone:
            for event in zip(what, kept, layer, base):
                merged[event[:3]] = max(merged.get(event[:3], event[3]), event[3])
        self._target.set_margin(max(margin for _, margin in everyone))  # Note [Room after a step over the target]
        events = list(merged)
        self._target.set_bases([e[0] for e in events], [e[1] for e in events], [e[2] for e in events],
                               [merged[e] for e in events])

    def _agree_candidates(self) -> None:
        if self._world() is None:
            return
        everyone = self._gather([list(x) for x in self._target.candidates()])
        counts, budget, kept, backward, micros, ckpt, forward = everyone[0]
        if any(theirs[0] != counts for theirs in everyone):
            raise MemoryTargetError(f"hpac: memory target: the ranks' layers have {[e[0] for e in everyone]} "
                                    "candidate plans; every rank must run the same layers")
        mine = list(self._target.candidates())
        kept = [max(theirs[2][k] for theirs in everyone) for k in range(len(kept))]
        backward = [max(theirs[3][k] for theirs in everyone) for k in range(len(backward))]
        forward = [max(theirs[6][k] for theirs in everyone) for k in range(len(forward))]
        self._target.set_candidates(counts, mine[1], kept, backward, micros, mine[5], forward)

    # --- reading ---------------------------------------------------------------------------------------------
    def watch_optimizer(self, optimizer: torch.optim.Optimizer) -> None:
        """Marks the optimizer step: "the rest" of the step opens before it (if layer 0's input gradient has not
        opened it: a frozen embedding), and the step closes when it returns, so that what runs before the next
        step's forward (another model's step, an evaluation) does not count in this step. Without it a step ends at
        the model's next call. Needs torch >= 2.0 (Optimizer.register_step_pre_hook / post_hook)."""
        if not hasattr(optimizer, "register_step_post_hook"):
            raise MemoryTargetError(f"hpac: watch_optimizer needs torch >= 2.0 (Optimizer.register_step_post_hook); "
                                    f"this is torch {torch.__version__}: the step then ends at the model's next call")
        self._watching = True
        self._optimizer_hooks += [optimizer.register_step_pre_hook(functools.partial(_TargetCall.step_starts, self)),
                                  optimizer.register_step_post_hook(functools.partial(_TargetCall.step_done, self))]

    def report(self) -> Dict[str, Any]:
        """{'target_bytes', 'predicted_bytes', 'predicted_event', 'planned_at_step', 'margin_bytes' (the room plans
        keep below the target after a step over it), 'error', 'layers': [per layer:
        path, checkpointed, budget_bytes, kept_bytes, backward_bytes, forward_bytes, off_bytes, recompute_micros],
        'events': {what: base bytes}, 'history': [per finished step: measured (and predicted) peak and what set
        them]}."""
        return json.loads(self._target.report_json())

    @property
    def plan(self) -> List[LayerPlan]:
        return [LayerPlan(**layer) for layer in self.report()["layers"]]

    @property
    def history(self) -> List[Dict[str, Any]]:
        return self.report()["history"]

    @property
    def predicted_bytes(self) -> int:
        return self.report()["predicted_bytes"]

    def uniform_plans(self) -> List[Dict[str, Any]]:
        """What the model predicts for each plan a user could set the same for every layer — no checkpoint, or the
        budget at k/16 of each layer's off bytes — beside the plan made: per plan 'plan' ('off' or the fraction),
        'predicted_bytes', 'recompute_micros', 'fits'. Empty before the plan is made."""
        peaks, micros = self._target.uniform_plans()
        counts, budgets = self._target.candidates()[:2]
        first = list(budgets[:counts[0]]) if counts else []
        return [{"plan": "off" if k == 0 else f"budget {first[k]} B on layer 0 (candidate {k})", "candidate": k,
                 "predicted_bytes": peak, "recompute_micros": us, "fits": peak <= self.target_bytes}
                for k, (peak, us) in enumerate(zip(peaks, micros))]

    def remove(self) -> None:
        """Unwraps the layers and removes the step and optimizer hooks."""
        self._hook.remove()
        for handle in self._optimizer_hooks:
            handle.remove()
        self._optimizer_hooks = []
        for layer in self._layers:
            unwrap_checkpoint(layer.module)


class _TargetCall:
    """One layer's forward under a target: marks the step's events around it, checkpointed or not as planned. Holds
    the target weakly in spirit: the module holds this object, the target holds the module; both die with the model."""
    __slots__ = ("target", "index")

    def __init__(self, target: MemoryTarget, index: int):
        self.target, self.index = target, index

    def call(self, original, *args, **kwargs):
        t = self.target
        t._layer_begin(self.index, args, kwargs)
        layer = t._layers[self.index]
        if layer.checkpointed and torch.is_grad_enabled():
            out = layer.checkpointed_call(original, *args, **kwargs)
        else:
            out = original(*args, **kwargs)
        t._layer_end(self.index, out)
        return out

    @staticmethod
    def backward_mark(target: MemoryTarget, event: Event, grad):
        target._mark(event)

    @staticmethod
    def step_starts(target: MemoryTarget, optimizer, args, kwargs):
        if not target._rest_open:
            target._mark(("the rest", 0, -1))

    @staticmethod
    def step_done(target: MemoryTarget, optimizer, args, kwargs):
        target._since_optimizer = 0
        target._close_step()  # the step ends here: its history row now, nothing counted until the next begins


def _hpac_checkpointed(policy, original, /, *args, **kwargs):
    # The module's own keywords stay its own, whatever their names (hpac.checkpoint reserves torch's).
    from ._frame import checkpoint_call
    from ._regions import RegionOptions
    return checkpoint_call(original, args, kwargs, policy, RegionOptions())


def fit_memory_target(model: torch.nn.Module, layers: Sequence[torch.nn.Module], target: Union[int, str], *,
                      cost: str = "measured", log: Optional[Callable[[str, str], None]] = None,
                      optimizer: Optional[torch.optim.Optimizer] = None, group: Any = None) -> MemoryTarget:
    """Fits every training step of `model` into `target` bytes by choosing, per layer of `layers`, what it keeps
    (docs/python.md, "Fit a step into N bytes").

    Args:
        model: the module whose call is one step's forward (its forward pre-hook marks each step's start).
        layers: the layers to plan, in the order the forward runs them (each wrapped in place; state_dict keys
            unchanged).
        target: the most live tensor bytes during a step, as an int or '70GiB'; on CPU measured by hpac's tracking
            allocator (hpac.track_memory() before the model is built), on CUDA by the caching allocator.
        cost: what recompute time is weighed by: 'measured' or 'estimated' (hpac.budget's cost).
        log: called as log(level, message) with the plan and each step's measurement; default: none.
        optimizer: the step ends when its step() returns (MemoryTarget.watch_optimizer); default: at the model's
            next call.
        group: under torch.distributed, the ranks that plan together (default: the default group; Note [One step
            plan for every rank]): every rank of it must call the model at every step.

    Returns:
        the MemoryTarget (report(), plan, history; remove() undoes it).
    """
    target_bytes = parse_bytes(target)
    layers = list(layers)
    if not layers:
        raise MemoryTargetError("hpac: fit_memory_target needs at least one layer to plan")
    entries = []
    for i, module in enumerate(layers):
        if not isinstance(module, torch.nn.Module):
            raise TypeError(f"hpac: fit_memory_target: layer {i} is a {type(module).__name__}, not a torch.nn.Module")
        region = make_budget(bytes=0, cost=cost)
        entries.append((f"layer {i}", module, region, functools.partial(_hpac_checkpointed, region)))
    fitted = MemoryTarget(model, entries, target_bytes, log, group)
    if optimizer is not None:
        fitted.watch_optimizer(optimizer)
    return fitted
