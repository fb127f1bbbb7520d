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
import gc
import json
import weakref
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple, Union

import torch

from ._budget import Budget, budget as make_budget
from ._wrap import unwrap_checkpoint, wrap_forward

class MemoryTargetError(ValueError):
    """The target cannot be met (below the floor) or is malformed; raised before the step it would concern runs."""


def parse_bytes(value: Union[int, str], what: str = "memory target") -> int:
    """Bytes from an int (bytes) or a size with a unit ('70GiB', '1.5GiB', '512MiB'): the one grammar of the trainer
    YAML, hpac.hf's dict and `python -m hpac plan` (Note [One size grammar], policy/byte_size.h, read by
    torch.ops.hpac.parse_memory_target). MemoryTargetError naming the value and what is allowed."""
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        raise MemoryTargetError(f"hpac: {what} {value!r} is a {type(value).__name__}; allowed: an int (bytes) or a "
                                "size with a unit: B, KiB, MiB, GiB or TiB ('70GiB')")
    if isinstance(value, int):
        if value <= 0:
            raise MemoryTargetError(f"hpac: {what} {value} is not above zero; allowed: an int > 0 (bytes) or a size "
                                    "with a unit: B, KiB, MiB, GiB or TiB ('70GiB')")
        return value
    try:
        return int(torch.ops.hpac.parse_memory_target(value))
    except RuntimeError as e:
        raise MemoryTargetError(f"hpac: {what} {str(e).splitlines()[0]}") from None


def format_bytes(n: int) -> str:
    """'512 B', '3.5 KiB', '12.34 MiB', '70.000 GiB': the one byte formatter (policy/byte_size.h)."""
    return torch.ops.hpac.format_bytes(int(n))


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

    def take_peak(self, event: Any = None) -> int:
        """The peak since the last take (`event`: what it closes, unused here); the next one starts from now. On
        CUDA this resets torch's peak counters (torch.cuda.reset_peak_memory_stats): the caching allocator keeps one
        peak."""
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
    checkpointed_call: Optional[Callable[..., Any]]  # checkpointed_call(original, *args, **kwargs); None: never


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
    """A whole-step memory target over `layers` of `model` (made by fit_memory_target or hpac.hf.prepare): the hooks
    of policy/step_driver.h (torch.classes.hpac.StepDriver), which owns the step's events, plans and reports. Here:
    the hooks (a forward pre-hook on the model, the layers' wrappers, tensor hooks for the backward, the optimizer's
    step hooks), the meter's numbers, and the exchange of the ranks' state (Note [One step plan for every rank],
    policy/step_driver.cpp). The model owns the target (its pre-hook and the layers' wrappers); tensor and optimizer
    hooks hold it weakly, as hpac-train's front end (tools/trainer/memory_target.h) does."""

    def __init__(self, model: torch.nn.Module, layers: Sequence[Tuple[str, torch.nn.Module, Budget, Callable]],
                 target_bytes: int, log: Optional[Callable[[str, str], None]] = None, group: Any = None,
                 measure_only: bool = False):
        self.target_bytes = target_bytes
        self._group = group
        self.model = model
        # The meter (_Meter's methods): by default the live tensor bytes of the parameters' device, made at the first
        # step (the model may move); measure_with() gives another before it.
        self._meter: Any = None
        self._measure_only = measure_only  # the events measured, never planned: every layer runs as given
        self._optimizer_hooks: list = []
        self._layers = [_Layer(path, module, b, call) for path, module, b, call in layers]
        self._driver = self._new_driver()
        for i, layer in enumerate(self._layers):
            wrap_forward(layer.module, functools.partial(_TargetCall.call, _TargetCall(self, i)))
        self._log = log
        self._hook = model.register_forward_pre_hook(self._step_begin)
        self._started = False
        self.error: Optional[MemoryTargetError] = None

    def _new_driver(self):
        local = [getattr(p, "_local_tensor", p) for p in self.model.parameters()]  # a DTensor's shard on this rank
        params = sum(t.numel() * t.element_size() for t in local)
        grads = sum(t.numel() * t.element_size() for t, p in zip(local, self.model.parameters()) if p.requires_grad)
        if self._meter is not None:  # the floor's parts as the meter counts them (one rank's share)
            params, grads = self._meter.sharded(params), self._meter.sharded(grads)
        driver = torch.classes.hpac.StepDriver(self.target_bytes, params, grads, self._measure_only)
        for layer in self._layers:
            driver.add_layer(layer.path, layer.budget._region)
        return driver

    def measure_with(self, meter: Any) -> None:
        """Reads the step's bytes through `meter` instead of the device's, from the first step on: an object with
        current() (live bytes), take_peak(event) (the peak since the last take; `event`, the (kind, layer) the
        next driver call closes), take_fragmentation() and sharded(nbytes) (what one rank holds of the model's
        parameters or gradients). hpac.plan measures one rank of a sharded job this way (Note [One rank of a
        sharded step], hpac/plan.py)."""
        if self._started:
            raise MemoryTargetError("hpac: MemoryTarget.measure_with after the first step; allowed: before it")
        self._meter = meter
        self._driver = self._new_driver()

    # --- the hooks: the meter's numbers to the driver --------------------------------------------------------
    def _peak(self) -> int:
        """The meter's peak since its last read, for the event the driver has open (which the next call closes)."""
        if self._meter is None:
            return 0
        return self._meter.take_peak(tuple(self._driver.open_event()))

    def _say(self, messages) -> None:
        for warning, text in messages:
            if self._log is not None:
                self._log("warning" if warning else "info", text)

    def _raise_error(self) -> None:
        if self.error is None and self._driver.error():
            self.error = MemoryTargetError(self._driver.error())
        if self.error is not None:
            raise self.error

    def _step_begin(self, module, args) -> None:
        if not torch.is_grad_enabled():
            return
        if self._meter is None:
            param = next(self.model.parameters(), None)
            self._meter = _Meter(param.device if param is not None else torch.device("cpu"))
        if not self._started:
            # Note [The first step measures the step]
            # What dropped models left in reference cycles (a transformers model is in one: its parameters stay
            # until Python's collector runs) is collected before step 1 is measured, not at some allocation inside
            # it, where it made the profile step's peak look larger than the step (a run after others in one
            # process: the previous model's parameters, 4 MiB on the hf tests' model) and its bases smaller (Note
            # [Profile, then absolute bases], policy/step_target.h). Once per target: a gc.collect() costs tenths
            # of a second in a process with transformers imported.
            gc.collect()
        self._started = True
        d = self._driver
        peak, fragmentation = self._peak(), self._meter.take_fragmentation()
        self._say(d.step_begins(peak, self._meter.current(), fragmentation))
        self._raise_error()
        if _world(self._group) is not None:
            d.merge(_gather(d.state(), self._group))
        self._say(d.before_layers(self._peak()))
        self._raise_error()

    def _step_ends(self) -> None:
        if self._meter is None:
            return
        self._say(self._driver.step_ends(self._peak(), self._meter.take_fragmentation(), self._meter.current()))

    def _layer_begin(self, i: int, args, kwargs) -> None:
        if not torch.is_grad_enabled():
            return
        self._driver.forward_begins(i, self._peak())
        if i == 0:
            x = _first_tensor(list(args) + list(kwargs.values()))
            if x is not None and x.requires_grad:
                x.register_hook(functools.partial(_TargetCall.rest_begins, weakref.ref(self)))

    def _layer_end(self, i: int, out) -> None:
        if not torch.is_grad_enabled():
            return
        self._driver.forward_ends(i, self._peak())
        y = _first_tensor([out])
        if y is not None and y.requires_grad:
            y.register_hook(functools.partial(_TargetCall.backward_begins, weakref.ref(self), i))

    def seed(self, record: Dict[str, Any], source: str) -> None:
        """Makes a plan file's layers (`record`: hpac.plan.load's dict, or MemoryTarget.report()'s) the first plan
        where this run's measured profile step predicts them within the target, and this run's own plan otherwise,
        with a warning (Note [A plan file is a first plan], policy/step_target.cpp). Before the first step."""
        self._driver.seed(json.dumps(record), source)

    # --- reading ---------------------------------------------------------------------------------------------
    def watch_optimizer(self, optimizer: torch.optim.Optimizer) -> None:
        """Marks the optimizer step: "the rest" of the step opens before it (if layer 0's input gradient has not
        opened it: a frozen embedding), and the step closes when it returns, so that what runs before the next
        step's forward (another model's step, an evaluation) does not count in this step. Without it a step ends at
        the model's next call. Needs torch >= 2.0 (Optimizer.register_step_pre_hook / post_hook)."""
        if not hasattr(optimizer, "register_step_post_hook"):
            raise MemoryTargetError(f"hpac: watch_optimizer needs torch >= 2.0 (Optimizer.register_step_post_hook); "
                                    f"this is torch {torch.__version__}: the step then ends at the model's next call")
        self._driver.watch_optimizer()
        me = weakref.ref(self)
        self._optimizer_hooks += [optimizer.register_step_pre_hook(functools.partial(_TargetCall.step_starts, me)),
                                  optimizer.register_step_post_hook(functools.partial(_TargetCall.step_done, me))]

    def report(self) -> Dict[str, Any]:
        """The step record (policy/step_record.h, Note [The step record's format]): {'format', 'target_bytes',
        'predicted_bytes', 'predicted_event', 'planned_at_step', 'margin_bytes' (the room plans keep below the target
        after a step over it), 'error', 'measured_bytes' and 'measured_event' (the last step's), 'recompute_micros',
        'layers': [per layer (LayerPlan): path, checkpointed, budget_bytes, kept_bytes, backward_bytes,
        forward_bytes, off_bytes, recompute_micros], 'events': {what: base bytes}, 'history': [per finished step:
        measured (and predicted) peak and what set them]}."""
        return json.loads(self._driver.report_json())

    @property
    def plan(self) -> List[LayerPlan]:
        return [LayerPlan(**{k: v for k, v in layer.items() if k != "ops"}) for layer in self.report()["layers"]]

    @property
    def history(self) -> List[Dict[str, Any]]:
        return self.report()["history"]

    @property
    def modules(self) -> List[torch.nn.Module]:
        """The planned layers' modules, in the order the forward runs them."""
        return [layer.module for layer in self._layers]

    @property
    def predicted_bytes(self) -> int:
        return self.report()["predicted_bytes"]

    def uniform_plans(self) -> List[Dict[str, Any]]:
        """What the model predicts for each plan a user could set the same for every layer — no checkpoint, or the
        budget at k/16 of each layer's off bytes — beside the plan made: per plan 'plan' ('off' or the fraction),
        'predicted_bytes', 'recompute_micros', 'fits'. Empty before the plan is made."""
        return [{"plan": "off" if k == 0 else f"budget {budget} B on layer 0 (candidate {k})", "candidate": k,
                 "predicted_bytes": peak, "recompute_micros": us, "fits": peak <= self.target_bytes}
                for k, (peak, us, budget) in enumerate(self._driver.uniform_plans())]

    def remove(self) -> None:
        """Unwraps the layers and removes the step and optimizer hooks."""
        self._hook.remove()
        for handle in self._optimizer_hooks:
            handle.remove()
        self._optimizer_hooks = []
        for layer in self._layers:
            unwrap_checkpoint(layer.module)


def _world(group):
    import torch.distributed as dist
    if dist.is_available() and dist.is_initialized() and dist.get_world_size(group) > 1:
        return dist
    return None


def _gather(value, group) -> list:
    dist = _world(group)
    if dist is None:
        return [value]
    everyone = [None] * dist.get_world_size(group)
    dist.all_gather_object(everyone, value, group=group)
    return everyone


class _TargetCall:
    """One layer's forward under a target: marks the step's events around it, checkpointed or not as planned. The
    module holds this object, and this object the target: the model owns its target. The hooks below, which
    autograd and the optimizer hold, reach it through a weak reference."""
    __slots__ = ("target", "index")

    def __init__(self, target: MemoryTarget, index: int):
        self.target, self.index = target, index

    def call(self, original, *args, **kwargs):
        t = self.target
        t._layer_begin(self.index, args, kwargs)
        layer = t._layers[self.index]
        if layer.checkpointed_call is not None and t._driver.checkpointed(self.index) and torch.is_grad_enabled():
            out = layer.checkpointed_call(original, *args, **kwargs)
        else:
            out = original(*args, **kwargs)
        t._layer_end(self.index, out)
        return out

    @staticmethod
    def backward_begins(target: "weakref.ref[MemoryTarget]", i: int, grad):
        t = target()
        if t is not None:
            t._driver.backward_begins(i, t._peak())

    @staticmethod
    def rest_begins(target: "weakref.ref[MemoryTarget]", grad):
        t = target()
        if t is not None:
            t._driver.rest_begins(t._peak())

    @staticmethod
    def step_starts(target: "weakref.ref[MemoryTarget]", optimizer, args, kwargs):
        t = target()
        if t is not None and t._meter is not None:
            t._driver.optimizer_begins(t._peak(), t._meter.current())

    @staticmethod
    def step_done(target: "weakref.ref[MemoryTarget]", optimizer, args, kwargs):
        t = target()
        if t is not None:
            t._step_ends()  # the step ends here: its history row now, nothing counted until the next begins


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
