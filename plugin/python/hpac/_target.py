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
import re
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple, Union

import torch

from ._budget import Budget, budget as make_budget
from ._wrap import unwrap_checkpoint, wrap_forward

_UNITS = {"B": 1, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30}
_ALLOWED = ("allowed: the most tensor bytes one rank may hold during a step, > 0: an int, or a number with a unit: "
            "B, KiB, MiB or GiB ('70GiB')")
# Candidate budgets per checkpointed layer: k/_STEPS of what it keeps under off, k = 0.._STEPS.
_STEPS = 16


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


def gib(n: float) -> str:
    return f"{n / (1 << 30):.3f} GiB" if abs(n) >= 1 << 30 else f"{n / (1 << 20):.2f} MiB"


class _Meter:
    """The live tensor bytes of the step's device and their peak since the last read."""

    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"
        if not self.cuda and device.type != "cpu":
            raise MemoryTargetError(f"hpac: a memory target measures CPU (hpac's tracking allocator) or CUDA (the "
                                    f"caching allocator) tensors; the model is on {device}")
        if not self.cuda and not torch.ops.hpac.memory_tracked():
            raise MemoryTargetError("hpac: a memory target on CPU reads hpac's tracking allocator: call "
                                    "hpac.track_memory() before the model is built (it counts only what is "
                                    "allocated after)")
        self.device = device

    def current(self) -> int:
        if self.cuda:
            return torch.cuda.memory_allocated(self.device)
        return torch.ops.hpac.memory_stats()["current_bytes"]

    def take_peak(self) -> int:
        """The peak since the last take; the next one starts from now."""
        if self.cuda:
            peak = torch.cuda.max_memory_allocated(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
            return peak
        return torch.ops.hpac.take_event_peak()  # apart from memory_stats' peak, which the caller may reset

    def fragmentation(self) -> int:
        """On CUDA, what the caching allocator holds beyond the live tensors (it counts against the device)."""
        if not self.cuda:
            return 0
        return max(0, torch.cuda.max_memory_reserved(self.device) - torch.cuda.max_memory_allocated(self.device))


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


@dataclass(eq=False)
class _Layer:
    path: str
    module: torch.nn.Module
    budget: Budget
    checkpointed_call: Callable[..., Any]  # checkpointed_call(original, *args, **kwargs)
    plan: LayerPlan = None
    candidates: List[Tuple[int, int, int, float, bool]] = field(default_factory=list)  # (budget, kept, bwd, µs, ckpt)


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
    """A whole-step memory target over `layers` of `model` (made by fit_memory_target or hpac.hf.prepare)."""

    def __init__(self, model: torch.nn.Module, layers: Sequence[Tuple[str, torch.nn.Module, Budget, Callable]],
                 target_bytes: int, log: Optional[Callable[[str, str], None]] = None, group: Any = None):
        self.target_bytes = target_bytes
        self._group = group  # Note [One step plan for every rank]
        self.model = model
        param = next(model.parameters(), None)
        self._meter = _Meter(param.device if param is not None else torch.device("cpu"))
        self._layers = [_Layer(path, module, b, call) for path, module, b, call in layers]
        for i, layer in enumerate(self._layers):
            layer.plan = LayerPlan(layer.path)
            wrap_forward(layer.module, functools.partial(_TargetCall.call, _TargetCall(self, i)))
        self._log = log
        self._hook = model.register_forward_pre_hook(self._step_begin)
        self._bases: Dict[Event, int] = {}      # Note [The step's peak as events]: calibrated base bytes per event
        self._step: Optional[Dict[Event, int]] = None  # this step's measured peak per event
        self._event: Optional[Event] = None     # the event open now
        self._steps = 0
        self._start_bytes: List[int] = []       # live bytes at each step's start
        self._planned_at = 0                    # the step whose start made the plan; 0: not planned
        self.history: List[Dict[str, Any]] = []  # per measured step: predicted and measured peak, what set them
        self.predicted_bytes = 0
        self.predicted_event = ""
        self.error: Optional[MemoryTargetError] = None

    # --- measuring -------------------------------------------------------------------------------------------
    def _mark(self, event: Optional[Event]) -> None:
        """Closes the event open now (its peak) and opens `event`."""
        if self._step is not None and self._event is not None:
            peak = self._meter.take_peak()
            self._step[self._event] = max(self._step.get(self._event, 0), peak)
        else:
            self._meter.take_peak()
        self._event = event

    def _step_begin(self, module, args) -> None:
        if not torch.is_grad_enabled():
            return
        self._mark(None)
        if self._step is not None:
            self._finish_step(self._step)
        if self.error is not None:
            raise self.error
        self._start_bytes.append(self._meter.current())
        self._steps += 1
        if self._planned_at == 0 and self._steps >= 2:
            self._plan_first()
        elif self._planned_at and self._needs_replan():
            self._replan("a step's measured peak went over its prediction")
        self._step = {}
        self._mark(("before the layers", 0, -1))

    def _layer_begin(self, i: int, args, kwargs) -> None:
        if self._step is None or not torch.is_grad_enabled():
            return
        self._mark((f"forward of layer {i}", i + 1, -1))
        if i == 0:
            x = _first_tensor(list(args) + list(kwargs.values()))
            if x is not None and x.requires_grad:
                x.register_hook(functools.partial(_TargetCall.backward_mark, self, ("the rest", 0, -1)))

    def _layer_end(self, i: int, out) -> None:
        if self._step is None or not torch.is_grad_enabled():
            return
        last = i == len(self._layers) - 1
        self._mark(("after the layers" if last else f"after layer {i}", i + 1, -1))
        y = _first_tensor([out])
        if y is not None and y.requires_grad:
            y.register_hook(functools.partial(_TargetCall.backward_mark, self, (f"backward of layer {i}", i, i)))

    def _finish_step(self, measured: Dict[Event, int]) -> None:
        """Closes a step: its events against the plan it ran (the kept bytes its layers' plans add)."""
        self._step = None
        if not measured:
            return
        peak_event = max(measured, key=measured.get)
        row = {"step": self._steps, "measured_bytes": measured[peak_event], "measured_event": peak_event[0],
               "planned": bool(self._planned_at)}
        if self._planned_at:
            row.update(predicted_bytes=self.predicted_bytes, predicted_event=self.predicted_event,
                       target_bytes=self.target_bytes, fragmentation_bytes=self._meter.fragmentation())
            measured_peak = measured[peak_event] + row["fragmentation_bytes"]
            if measured_peak > self.target_bytes:
                self._say("warning", f"memory target {gib(self.target_bytes)}: step {self._steps} measured "
                          f"{gib(measured_peak)} at {peak_event[0]} (predicted {gib(self.predicted_bytes)} at "
                          f"{self.predicted_event}); the plan is tightened for the next step")
            elif not self.history[-1].get("planned"):  # the first step under the plan
                self._say("info", f"memory target {gib(self.target_bytes)}: step {self._steps} measured "
                          f"{gib(measured_peak)} at {peak_event[0]}, predicted {gib(self.predicted_bytes)} at "
                          f"{self.predicted_event} (slack "
                          f"{100.0 * (self.target_bytes - measured_peak) / self.target_bytes:.1f}%)")
        self.history.append(row)
        for event, peak in measured.items():  # calibrate: a base only ever rises (Note [The step's peak as events])
            base = peak - self._held(event) + (self._meter.fragmentation() if self._planned_at else 0)
            if self._planned_at == 0 and event[0] != "the rest":
                base -= self._start_bytes[-1]  # step 1: relative to its start (the optimizer state comes later)
            self._bases[event] = max(self._bases.get(event, base), base) if self._planned_at else base
        if self._planned_at:
            self._bases = self._agree_bases(self._bases)

    def _held(self, event: Event) -> int:
        """What the current plan's layers add to `event`."""
        _, m, own = event
        held = sum(layer.plan.kept_bytes for layer in self._layers[:m]) if self._planned_at else 0
        if own >= 0 and self._planned_at:
            held += self._layers[own].plan.backward_bytes
        return held

    # --- planning --------------------------------------------------------------------------------------------
    def _candidates(self) -> None:
        """Each layer's candidate plans, computed once per layer structure (layers of one shape share them)."""
        shared: Dict[Any, list] = {}
        for layer in self._layers:
            region = layer.budget._region
            status = region.status()
            off = max(status["off_bytes"], 0)
            names, occurrences = region.profile()[:2]
            key = (tuple(names), tuple(occurrences), off, status["total_bytes"])
            if key not in shared:
                budgets = sorted({off * k // _STEPS for k in range(_STEPS + 1)})
                b, kept, unread, micros = region.candidates(budgets)
                # Not checkpointed first: off's bytes, no recompute, no checkpoint around it (it wins ties).
                shared[key] = [(off, off, 0, 0.0, False)]
                shared[key] += [(b[k], kept[k], unread[k], micros[k], True) for k in range(len(b))]
            layer.candidates = shared[key]
            layer.plan.off_bytes = off

    def _solve(self):
        counts = [len(layer.candidates) for layer in self._layers]
        flat = [c for layer in self._layers for c in layer.candidates]
        events = list(self._bases)
        choice, peak, at, micros, fits, exact, _ = torch.ops.hpac.plan_step(
            counts, [c[1] for c in flat], [c[2] for c in flat], [float(c[3]) for c in flat],
            [self._bases[e] for e in events], [e[1] for e in events], [e[2] for e in events], self.target_bytes)
        return list(choice), peak, events[at][0] if at >= 0 else "", fits

    def _plan_first(self) -> None:
        """At step 2's start: step 1's bases made absolute, the candidates, the plan."""
        ready = all(layer.budget.stage == "planned" for layer in self._layers)
        if not all(self._gather(ready)):
            return  # a region has not finished its profile (a layer not called yet): plan at the next step
        start = self._start_bytes[-1]
        for event in list(self._bases):
            if event[0] != "the rest":
                self._bases[event] += start
        self._candidates()
        self._bases = self._agree_bases(self._bases)
        self._agree_candidates()
        self._planned_at = self._steps
        self._replan(None)

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

    def _agree_bases(self, bases: Dict[Event, int]) -> Dict[Event, int]:
        merged: Dict[Event, int] = {}
        for theirs in self._gather(bases):
            for event, base in theirs.items():
                merged[event] = max(merged.get(event, base), base)
        return merged

    def _agree_candidates(self) -> None:
        everyone = self._gather([layer.candidates for layer in self._layers])
        if len(everyone) == 1:
            return
        for j, layer in enumerate(self._layers):
            lists = [theirs[j] for theirs in everyone]
            if len({len(c) for c in lists}) != 1:
                raise MemoryTargetError(f"hpac: memory target: layer {layer.path} has {[len(c) for c in lists]} "
                                        "candidate plans on the ranks; every rank must run the same layers")
            layer.candidates = [(mine[0], max(c[k][1] for c in lists), max(c[k][2] for c in lists), lists[0][k][3],
                                 mine[4]) for k, mine in enumerate(layer.candidates)]

    def _needs_replan(self) -> bool:
        return self._predict()[0] > self.target_bytes

    def _predict(self) -> Tuple[int, str]:
        best, what = 0, ""
        for event, base in self._bases.items():
            live = base + self._held(event)
            if live > best:
                best, what = live, event[0]
        return best, what

    def _replan(self, why: Optional[str]) -> None:
        choice, peak, what, fits = self._solve()
        if not fits:
            self._apply(choice)  # the floor: everything recomputed
            self.error = self._floor_error(peak, what)
            raise self.error
        self._apply(choice)
        self.predicted_bytes, self.predicted_event = peak, what
        off_everywhere = all(not layer.plan.checkpointed for layer in self._layers)
        ckpt = sum(layer.plan.checkpointed for layer in self._layers)
        kept = sum(layer.plan.kept_bytes for layer in self._layers)
        self._say("info", f"memory target {gib(self.target_bytes)}"
                  f"{'' if why is None else ' (again: ' + why + ')'}: " +
                  ("no checkpointing is needed: the step without it is predicted at "
                   f"{gib(peak)} ({what}); every layer runs unwrapped" if off_everywhere else
                   f"{ckpt} of {len(self._layers)} layers checkpointed, the layers keep {gib(kept)}; predicted "
                   f"peak {gib(peak)} at {what}, recompute {sum(l.plan.recompute_micros for l in self._layers):.0f} "
                   "µs per step predicted"))

    def _apply(self, choice: List[int]) -> None:
        for layer, k in zip(self._layers, choice):
            b, kept, bwd, micros, ckpt = layer.candidates[k]
            layer.plan = LayerPlan(layer.path, ckpt, b, kept, bwd, layer.plan.off_bytes, micros)
            if ckpt:
                layer.budget._region.replan(b)

    def _floor_error(self, floor: int, what: str) -> MemoryTargetError:
        local = [getattr(p, "_local_tensor", p) for p in self.model.parameters()]  # a DTensor's shard on this rank
        params = sum(t.numel() * t.element_size() for t in local)
        grads = sum(t.numel() * t.element_size() for t, p in zip(local, self.model.parameters()) if p.requires_grad)
        start = self._start_bytes[-1]
        return MemoryTargetError(
            f"hpac: memory target {gib(self.target_bytes)} is below this step's floor {gib(floor)} (every layer "
            f"recomputed), set by {what}: live at the step's start {gib(start)} (parameters {gib(params)}; optimizer "
            f"state and the rest {gib(start - params)}), gradients up to {gib(grads)}, and what {what} holds beside "
            f"them {gib(max(0, floor - start - grads))} (the logits and the loss after the layers; one layer's "
            "recompute and its gradients in a backward). To lower the floor: shard over more FSDP ranks, a smaller "
            "micro-batch, a shorter sequence; or name a target of at least the floor")

    def _say(self, level: str, message: str) -> None:
        if self._log is not None:
            self._log(level, message)

    def watch_optimizer(self, optimizer: torch.optim.Optimizer) -> None:
        """Ends each step's measurement when `optimizer.step()` returns: what runs between it and the next step's
        forward (another model's step, an evaluation) is then not counted in this step's events. Without it a step
        ends at the next call of the model. Needs torch >= 2.0 (Optimizer.register_step_post_hook)."""
        if not hasattr(optimizer, "register_step_post_hook"):
            raise MemoryTargetError(f"hpac: watch_optimizer needs torch >= 2.0 (Optimizer.register_step_post_hook); "
                                    f"this is torch {torch.__version__}: the step then ends at the model's next call")
        optimizer.register_step_post_hook(functools.partial(_TargetCall.step_done, self))

    # --- reading ---------------------------------------------------------------------------------------------
    def uniform_plans(self) -> List[Dict[str, Any]]:
        """What the model predicts for each plan a user could set by hand, the same for every layer — no checkpoint,
        or the budget at k/16 of each layer's off bytes — beside the plan made: per plan 'plan' ('off' or the
        fraction), 'predicted_bytes', 'recompute_micros', 'fits'. Empty before the plan is made."""
        if not self._planned_at:
            return []
        events = list(self._bases)
        counts = [len(layer.candidates) for layer in self._layers]
        flat = [c for layer in self._layers for c in layer.candidates]
        out = []
        for k in range(min(counts)):  # candidate k of every layer: 0 is unwrapped, k >= 1 the budget (k-1)/16
            choice = [k] * len(self._layers)
            peak, _ = torch.ops.hpac.step_peak(
                counts, [c[1] for c in flat], [c[2] for c in flat], [float(c[3]) for c in flat],
                [self._bases[e] for e in events], [e[1] for e in events], [e[2] for e in events], choice)
            micros = sum(layer.candidates[k][3] for layer in self._layers)
            out.append({"plan": "off" if k == 0 else (k - 1) / _STEPS, "predicted_bytes": peak,
                        "recompute_micros": micros, "fits": peak <= self.target_bytes})
        return out

    @property
    def plan(self) -> List[LayerPlan]:
        return [layer.plan for layer in self._layers]

    def report(self) -> Dict[str, Any]:
        """{'target_bytes', 'predicted_bytes', 'predicted_event', 'layers': [LayerPlan as dict], 'events': {what:
        base bytes}, 'history': [per step: measured (and predicted) peak and what set it]}."""
        return {"target_bytes": self.target_bytes, "predicted_bytes": self.predicted_bytes,
                "predicted_event": self.predicted_event, "planned_at_step": self._planned_at,
                "layers": [vars(p).copy() for p in self.plan],
                "events": {e[0]: base for e, base in self._bases.items()}, "history": list(self.history)}

    def remove(self) -> None:
        """Unwraps the layers and removes the step hook."""
        self._hook.remove()
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
        if layer.plan.checkpointed and torch.is_grad_enabled():
            out = layer.checkpointed_call(original, *args, **kwargs)
        else:
            out = original(*args, **kwargs)
        t._layer_end(self.index, out)
        return out

    @staticmethod
    def backward_mark(target: MemoryTarget, event: Event, grad):
        target._mark(event)

    @staticmethod
    def step_done(target: MemoryTarget, optimizer, args, kwargs):
        if target._step is not None:
            target._mark(None)  # the open event ends; nothing is counted until the next step begins


def _hpac_checkpointed(policy, original, *args, **kwargs):
    from ._frame import checkpoint
    return checkpoint(original, *args, policy=policy, **kwargs)


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
