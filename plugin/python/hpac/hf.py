"""hpac for Hugging Face transformers models: the trainer's rules (docs/trainer.md) applied in Python.

    import hpac.hf
    prep = hpac.hf.prepare(model, "train.yaml")    # or a dict from hpac.hf.load_config / parse_config
    ...train...
    stats = prep.take_layer_stats()                # per prepared layer: hpac's counters of its finished calls

The YAML is the hpac-train one, parsed and validated by the C++ parser (libhpac_config.so, torch.ops.hpac_config),
so errors carry the same `file:line:col`. The registry is the trainer's (tools/trainer/model_registry.yaml), read by
the same C++ code. Python only walks the module tree and wraps: the policy, the counting and the replay run in
libhpac.so, through `context_fn` regions of torch.utils.checkpoint (non-reentrant).

Routing: decided by the C++ route planner (tools/trainer/route_plan.h; plan_routes), the function hpac-train calls:
  off        nothing is touched.
  selective  every discovered layer (both towers) checkpointed whole with hpac's selective policy.
  budget     as selective, with the memory-budget policy: one hpac.budget(memory_budget) per layer (its region:
             profiled on the layer's first call, its plan replayed after); PreparedLayer.budget.status() shows it.
  full       one route, decided in this order (Note [Full decision order] in route_plan.cpp):
               1. not language-tower-only (a vision tower)      -> submodules
               2. KV sharing                                     -> submodules without attention
               3. train.compile: true                            -> compile: attention and MLP submodules
               4. every full layer trainable and a transformers GradientCheckpointingLayer, and the model
                  declares supports_gradient_checkpointing      -> native: the model's own
                  activation_checkpointing_enable (gradient_checkpointing_enable before transformers 5.x)
               5. otherwise                                      -> submodules (attention, MLP, both norms, MTP)
  KV sharing (num_kv_shared_layers > 0 in the config or a sub-config): use_cache kept, attention never
  checkpointed; selective (or budget) degrades (warning) to full checkpointing of the MLP, norm and MTP submodules.
  Without it use_cache is set False on the config and every sub-config.
Wrapping replaces `forward` on the module object: module tree, parameter names and state_dict keys are unchanged.
"""
import functools
import json
import os
import sys
import threading
from dataclasses import InitVar, dataclass, field
from typing import Callable, List, Optional, Union

import torch
import torch.utils.checkpoint

import hpac
from hpac import _step_record, _target
from hpac._loader import _ops_present
from hpac._regions import RegionOptions, region_context_fn
from hpac._wrap import unwrap_checkpoint, wrap_forward

__all__ = [
    "load_config_library", "load_config", "parse_config", "load_registry", "discover", "prepare", "Preparation",
    "Discovery", "unprepare", "plan_routes", "wrap_torch_checkpoint",
]

_lock = threading.Lock()
_config_library_path: Optional[str] = None  # what load_config_library loaded (python -m hpac prints it)


def _config_ops_present():
    return _ops_present("hpac_config", "load_config")


def load_config_library(path: Optional[str] = None) -> Optional[str]:
    """Makes torch.ops.hpac_config available (the C++ config parser, registry and route planner).

    Args:
        path: libhpac_config.so to load; default $HPAC_CONFIG_LIBRARY, else the one beside libhpac.so (the installed
            package's hpac/lib/), else the one of the build tree that serves libhpac.so (<build>/tools/trainer/).

    Returns:
        the path loaded, None if the ops were present already.
    """
    with _lock:
        if _config_ops_present():
            return None
        explicit = path or os.environ.get("HPAC_CONFIG_LIBRARY")
        lib_dir = os.path.dirname(hpac.load())
        candidates = [explicit] if explicit else [
            os.path.join(lib_dir, "libhpac_config.so"),
            os.path.join(os.path.dirname(lib_dir), "tools", "trainer", "libhpac_config.so")]
        found = next((c for c in candidates if os.path.exists(c)), None)
        if found is None:
            raise RuntimeError(f"hpac.hf: libhpac_config.so not found; looked at {', '.join(candidates)}. Install "
                               "hpac with pip (the wheel carries it), build the trainer (tools/build.sh, "
                               "HPAC_WITH_TRAINER=ON), or set HPAC_CONFIG_LIBRARY to its path")
        torch.ops.load_library(found)
        global _config_library_path
        _config_library_path = found
        return found


def load_config(path: Union[str, os.PathLike]) -> dict:
    """The hpac-train YAML at `path`, validated by the C++ parser, as a dict (Note [Config JSON] in
    tools/trainer/config_ops.cpp).

    Args:
        path: the YAML file.

    Raises:
        RuntimeError with the parser's "file:line:col: key: message" for bad input.
    """
    load_config_library()
    return json.loads(torch.ops.hpac_config.load_config(str(path)))


def parse_config(text: str, file: str = "<string>") -> dict:
    """As load_config, from YAML text; `file` names it in errors."""
    load_config_library()
    return json.loads(torch.ops.hpac_config.parse_config(text, file))


def load_registry(path: Optional[Union[str, os.PathLike]] = None) -> dict:
    """The model registry as a dict, read by the C++ parser.

    Args:
        path: a registry YAML; default $HPAC_MODEL_REGISTRY, else the shipped one (the installed package's
            hpac/share/hpac/model_registry.yaml, or tools/trainer/model_registry.yaml of the build's source).
    """
    load_config_library()
    return json.loads(torch.ops.hpac_config.load_registry(str(path) if path else ""))


# ---------------------------------------------------------------------------------------------------------------
# Discovery (the reference design's 6.1, docs/design.md): the tree's facts gathered here, the rules in
# tools/trainer/layer_finder.cpp

@dataclass
class LayerRef:
    """One layer of a container: its dotted path below the model, its index in the container, the module."""
    path: str
    index: int
    module: Optional[torch.nn.Module] = field(repr=False)


@dataclass
class Container:
    """A layer container: its role ("language" or "vision"), its dotted path, its layers in order."""
    role: str
    path: str
    layers: List[LayerRef]


@dataclass(eq=False)
class Discovery:
    """What discover() found: the model's class name, how the containers were found and the paths tried."""
    class_name: str
    how: str = ""
    containers: List[Container] = field(default_factory=list)
    tried: List[str] = field(default_factory=list)
    # the model reached through retrieval wrappers (the root otherwise)
    inner_model: Optional[torch.nn.Module] = field(default=None, repr=False)

    def _role(self, role):
        return next((c for c in self.containers if c.role == role), None)

    def language(self):
        return self._role("language")

    def vision(self):
        return self._role("vision")


def resolve_path(root: torch.nn.Module, path: str) -> Optional[torch.nn.Module]:
    """The module at dotted `path` below `root` ("" is root itself), or None."""
    at = root
    for part in path.split(".") if path else []:
        at = at._modules.get(part)
        if at is None:
            return None
    return at


def _kind(module):
    if isinstance(module, torch.nn.ModuleList):
        return "list"
    return "dict" if isinstance(module, torch.nn.ModuleDict) else "other"


def _module_tree(model):
    """The facts findLayers reads (tools/trainer/layer_finder.h), for every module; parameter counts for the
    ModuleLists and ModuleDicts only (the containers the largest-container rule weighs)."""
    rows = []
    for path, m in model.named_modules(remove_duplicate=False):
        kind = _kind(m)
        children = [k for k, v in m._modules.items() if v is not None]
        params = sum(p.numel() for p in m.parameters()) if kind != "other" and children else 0
        rows.append([path, type(m).__name__, kind, children, params])
    return rows


def discover(model: torch.nn.Module, registry: Optional[dict] = None) -> "Discovery":
    """Finds the layer containers of `model` with the rules of tools/trainer/layer_finder.h (the function the C++
    trainer's discovery calls, through torch.ops.hpac_config.find_layers): the module tree's facts in, the containers
    mapped back to their modules.

    Args:
        model: the root module; its class name is looked up in the registry.
        registry: a dict from load_registry (default: the shipped one).

    Raises:
        LookupError listing every path tried when there is no layer container.
    """
    registry = registry if registry is not None else load_registry()
    load_config_library()
    try:
        found = json.loads(torch.ops.hpac_config.find_layers(
            json.dumps({"registry": registry, "modules": _module_tree(model)}, ensure_ascii=False)))
    except RuntimeError as e:
        raise LookupError(str(e)) from None
    containers = [Container(c["role"], c["path"], [LayerRef(path, index, resolve_path(model, path))
                                                   for path, index in c["layers"]])
                  for c in found["containers"]]
    return Discovery(found["class_name"], how=found["how"], containers=containers, tried=found["tried"],
                     inner_model=resolve_path(model, found["inner_path"]))


# ---------------------------------------------------------------------------------------------------------------
# Routing (the reference design's 6.2-6.4, docs/design.md): facts gathered here, the plan made by
# tools/trainer/route_plan.cpp

@dataclass(eq=False)
class PreparedLayer:
    """One discovered layer as prepare() routed it (made from its LayerRef, whose path, index and module it copies),
    and the hpac invocations of its calls."""
    ref: InitVar[LayerRef]
    role: str
    mode: str                 # the planned mode: off | full | selective | budget
    record_ops: bool = False  # keep each call's op log; take_stats adds it up as "log:<phase> <op> <action>"
    # activation_checkpoint.routing / .state_writes (replay/recompute_rules.h)
    options: RegionOptions = field(default_factory=RegionOptions)
    path: str = field(init=False)
    index: int = field(init=False)
    module: torch.nn.Module = field(init=False, repr=False)
    compiled: bool = field(default=False, init=False)  # train.compile: compiled after wrapping (module.compile())
    layer: str = field(default="off", init=False)  # whole-layer checkpoint applied: off | full | selective | budget
    # mode budget: this layer's hpac.Budget (its region's profile and plan)
    budget: Optional["hpac.Budget"] = field(default=None, init=False)
    native: bool = field(default=False, init=False)  # through the model's own activation_checkpointing_enable
    submodules: List[str] = field(default_factory=list, init=False)  # children checkpointed (full), by name
    # hpac's counters of this layer's calls until take_layer_stats(): bounded, holds no invocation whose graph died
    _tally: "hpac.InvocationTally" = field(default_factory=hpac.InvocationTally, init=False, repr=False)

    def __post_init__(self, ref):
        self.path, self.index, self.module = ref.path, ref.index, ref.module

    def _context_fn(self, policy):
        if self.compiled:
            # One context_fn per policy for every layer, so that layers of one shape share one compiled graph (Note
            # [context_fn under torch.compile]); compiled code runs no eager invocation to take stats from.
            return region_context_fn(policy, False, self.options)
        return region_context_fn(policy, False, self.options, on_invocation=self._on_invocation,
                                 record_ops=self.record_ops)

    def _on_invocation(self, inv):
        self._tally.watch(inv)
        inv.name_state(self.module, prefix=self.path)  # messages name the buffer a recompute writes again

    def use_budget(self, budget: "hpac.Budget") -> None:
        """Serves this whole-layer budget layer's calls with `budget` from now on (e.g. a plan read from a file), with
        the layer's stats and op log as before."""
        if self.layer != "budget":
            raise ValueError(f"hpac.hf: layer {self.path} is checkpointed as {self.layer!r}, not as a budget layer")
        self.budget = budget
        wrap_torch_checkpoint(self.module, self._context_fn(budget))

    def take_stats(self) -> dict:
        """hpac's counters summed over this layer's calls since the last take ('invocations': how many calls), and
        "log:<phase> <op> <action>" counts with record_ops. A call whose graph is still alive adds what it did so
        far; the rest comes with the next take."""
        return self._tally.take()


@dataclass(eq=False)
class Preparation:
    """What prepare() did to a model: the route, the layers it prepared, what it wrapped and compiled, and its
    messages; unprepare() undoes it."""
    touched: bool = False
    discovery: Optional[Discovery] = None
    kv_sharing: bool = False
    use_cache_disabled: List[str] = field(default_factory=list)
    full_route: Optional[str] = None
    full_route_reason: str = ""
    layers_wrapped: int = 0
    submodules_wrapped: int = 0
    layers: List[PreparedLayer] = field(default_factory=list)
    compiled: List[str] = field(default_factory=list)  # paths of the layers compiled (train.compile)
    messages: List[str] = field(default_factory=list)
    warnings: List[str] = field(default_factory=list)
    _compiled_modules: list = field(default_factory=list, init=False, repr=False)
    _log: Optional[Callable[[str, str], None]] = field(default=None, init=False, repr=False)
    _native_model: Optional[torch.nn.Module] = field(default=None, init=False, repr=False)
    _config: Optional[dict] = field(default=None, init=False, repr=False)  # what prepare() applied
    # activation_checkpoint.memory_target: the whole step's target over the budget layers (report(), plan, history)
    target: Optional["hpac.MemoryTarget"] = field(default=None, init=False, repr=False)
    # activation_checkpoint.plan: {'path', 'data' (the plan file), 'by_path' (its layers), 'guard' (the shape hook)}
    step_plan: Optional[dict] = field(default=None, init=False, repr=False)

    def info(self, message):
        self.messages.append(message)
        if self._log:
            self._log("info", message)

    def warn(self, message):
        self.messages.append("warning: " + message)
        self.warnings.append(message)
        if self._log:
            self._log("warning", message)

    @property
    def route(self):
        """'off', 'selective', 'budget' or the full route ('native', 'compile', 'submodules'): what the demo table shows."""
        if not self.touched:
            return "off"
        if self.full_route:
            return self.full_route
        return "budget" if any(p.layer == "budget" for p in self.layers) else "selective"

    def step_report(self) -> dict:
        """The whole-step record of a run under activation_checkpoint.memory_target (its plan, what each layer keeps
        and its ops, the fixed parts, the last step measured), in the plan file's form; hpac.plan.report_text(...)
        prints it, hpac.plan.plot(...) draws it. Takes the layers' stats (as take_layer_stats)."""
        if self.target is None:
            raise ValueError("hpac.hf: step_report needs activation_checkpoint.memory_target (a whole-step target); "
                             "this preparation has none")
        return _step_record.run_report(self.target.model, self, self._config)

    def take_layer_stats(self) -> list:
        """hpac's counters summed over each prepared layer's calls since the last take (call after backward)."""
        return [layer.take_stats() for layer in self.layers]


def log_to_stderr(level: str, message: str) -> None:
    """prepare's default log: "[hpac] message", "[hpac] warning: message" on stderr."""
    print(f"[hpac] {'warning: ' if level == 'warning' else ''}{message}", file=sys.stderr)


def _configs(config, path="config"):
    """(path, config) for a transformers config and its sub-configs (text_config, vision_config, ...)."""
    yield path, config
    for key in sorted(getattr(config, "sub_configs", None) or {}):
        sub = getattr(config, key, None)
        if sub is not None and hasattr(sub, "to_dict"):
            yield from _configs(sub, f"{path}.{key}")


def _budget_of(memory_budget, cost="measured"):
    """A new region for activation_checkpoint.memory_budget and .cost (validated by the C++ parser: a fraction or
    bytes; measured or estimated)."""
    if memory_budget["bytes"] is not None:
        return hpac.budget(bytes=memory_budget["bytes"], cost=cost)
    return hpac.budget(memory_budget["fraction"], cost=cost)


def _torch_checkpointed(context_fn, original, /, *args, **kwargs):
    if not torch.is_grad_enabled():
        return original(*args, **kwargs)
    return torch.utils.checkpoint.checkpoint(original, *args, use_reentrant=False, context_fn=context_fn, **kwargs)


def wrap_torch_checkpoint(module: torch.nn.Module, context_fn: Callable) -> torch.nn.Module:
    """Puts torch.utils.checkpoint (non-reentrant) with `context_fn` (e.g. hpac.context_fn(...)) around every call of
    module's forward, in place: the one wrap mechanism (hpac._wrap.wrap_forward, which hpac.checkpoint_wrapper uses
    too; hpac.unwrap_checkpoint undoes either). Returns module."""
    return wrap_forward(module, functools.partial(_torch_checkpointed, context_fn))


def _supports_native(layer_module):
    try:
        from transformers.modeling_layers import GradientCheckpointingLayer
    except ImportError:
        return False
    return isinstance(layer_module, GradientCheckpointingLayer)


def _enable_native(model):
    kwargs = {"use_reentrant": False}
    if hasattr(model, "activation_checkpointing_enable"):
        model.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)


def plan_routes(facts: dict) -> dict:
    """The route plan (tools/trainer/route_plan.h: every rule of model preparation, the same function the C++
    trainer calls) for route facts given as a dict (the JSON of tools/trainer/route_plan_json.h). Returns the plan
    as a dict. A config the rules refuse raises ValueError naming the file or key."""
    load_config_library()
    try:
        return json.loads(torch.ops.hpac_config.plan_routes(json.dumps(facts, ensure_ascii=False)))
    except RuntimeError as e:
        raise ValueError(str(e)) from None


def _config_facts(config, compile_on):
    return {"file": config["file"], "activation_checkpoint": config["activation_checkpoint"],
            "activation_swap": config["activation_swap"], "compile": compile_on, "compiles_layers": True,
            "model": None}


def _model_facts(d):
    """What the planner needs of a discovered transformers model."""
    hf_config = getattr(d.inner_model, "config", None)
    configs = [[p, getattr(c, "num_kv_shared_layers", 0) or 0] for p, c in _configs(hf_config)] \
        if hf_config is not None else []
    layers = [{"path": ref.path, "index": ref.index, "role": c.role, "class_name": type(ref.module).__name__,
               "trainable": all(q.requires_grad for q in ref.module.parameters()),
               "native": _supports_native(ref.module), "has_seam": True, "children": list(ref.module._modules)}
              for c in d.containers for ref in c.layers]  # language first (layer_finder.h)
    return {"class_name": d.class_name, "how": d.how, "language_path": d.language().path,
            "has_vision": d.vision() is not None,
            "supports_checkpointing": bool(getattr(d.inner_model, "supports_gradient_checkpointing", False)),
            "configs": configs, "layers": layers}


def prepare(model: torch.nn.Module, config: Union[str, os.PathLike, dict], registry: Optional[dict] = None,
            log: Callable[[str, str], None] = log_to_stderr, record_ops: bool = False,
            compile_backend: str = "inductor") -> "Preparation":
    """Applies activation_checkpoint (and activation_swap) of `config` to `model` in place, then, with
    train.compile: true, compiles each layer. Discover, gather facts, plan (plan_routes: the C++ rules), apply.

    Args:
        model: a transformers model (or any module tree the registry's discovery finds layers in).
        config: the hpac-train YAML's path, a dict from load_config / parse_config, or a dict written by hand as the
            YAML would be ({"activation_checkpoint": {"mode": "budget", "memory_budget": 0.5}}), checked by the same
            C++ parser (its errors name the key, the line and column of the dict rendered as JSON, and what is
            allowed).
        registry: a dict from load_registry (default: the shipped one).
        log: called as log(level, message) for every decision, level 'info' or 'warning'.
        record_ops: add every region's op log to the per-layer stats, one count per
            "log:<phase> <op> <action>" key (hpac.Invocation's op_log lines: action saved, run, served, recomputed
            or ignored); compiled layers run no eager invocation and report none.
        compile_backend: with train.compile: true, each layer is compiled with module.compile(backend=...).

    Returns:
        a Preparation (route, wrap counts, messages, per-layer stats). unprepare(model, prep) undoes it.
    """
    if not isinstance(config, dict):
        config = load_config(config)
    elif "file" not in config:  # written by hand, not by the parser: checked by it (JSON is YAML)
        config = parse_config(json.dumps(config, indent=1), "<the dict given to hpac.hf.prepare>")
    prep = Preparation()
    prep._log = log
    prep._config = config
    compile_on = config["train"]["compile"]
    facts = _config_facts(config, compile_on)
    plan = plan_routes(facts)
    if plan["needs_model"]:
        reg = registry if registry is not None else load_registry()
        prep.discovery = discover(model, reg)
        facts.update(model=_model_facts(prep.discovery), aliases=reg["aliases"])
        plan = plan_routes(facts)
    for level, message in plan["messages"]:
        (prep.warn if level == "warning" else prep.info)(message)
    _read_step_plan(prep, model, config)
    _apply(prep, plan, config, record_ops, compile_on)
    _fit_target(prep, model, config["activation_checkpoint"])
    if compile_on:
        targets = prep.layers if prep.touched else [ref for c in prep.discovery.containers for ref in c.layers]
        _compile_layers(prep, targets, compile_backend)
    return prep


def _apply(prep, plan, config, record_ops, compile_on):
    """Carries out a route plan on the discovered model."""
    for key in ("touched", "kv_sharing", "full_route", "full_route_reason", "layers_wrapped", "submodules_wrapped"):
        setattr(prep, key, plan[key])
    if not plan["touched"]:
        return
    d = prep.discovery
    hf_config = getattr(d.inner_model, "config", None)
    configs = dict(_configs(hf_config)) if hf_config is not None else {}
    for path in plan["use_cache_off"]:
        configs[path].use_cache = False
        prep.use_cache_disabled.append(path)
    ac = config["activation_checkpoint"]
    options = RegionOptions(routing=ac["routing"], state_writes=ac["state_writes"])
    refs = {ref.path: (ref, c.role) for c in d.containers for ref in c.layers}
    for lp in plan["layers"]:
        ref, role = refs[lp["path"]]
        prep.layers.append(PreparedLayer(ref, role, lp["mode"], record_ops, options))
        prep.layers[-1].compiled = compile_on
    if prep.full_route == "native":
        _enable_native(d.inner_model)
        prep._native_model = d.inner_model
    for p, lp in zip(prep.layers, plan["layers"]):
        _apply_layer(prep, p, lp, ac)


def _apply_layer(prep, p, lp, ac):
    if lp["mode"] == "off":
        if prep.full_route == "native" and hasattr(p.module, "gradient_checkpointing"):
            p.module.gradient_checkpointing = False  # the native enable turned every layer on
        return
    p.layer, p.native = lp["layer"], lp["native"]
    if p.native:
        # The model's own path (GradientCheckpointingLayer.__call__), with this layer's hpac region.
        p.module._gradient_checkpointing_func = functools.partial(
            torch.utils.checkpoint.checkpoint, use_reentrant=False, context_fn=p._context_fn("full"))
    elif p.layer == "budget" and ac.get("memory_target"):  # wrapped by _fit_target
        p.budget = hpac.budget(bytes=0, cost=ac.get("cost", "measured"))
    elif p.layer == "budget" and prep.step_plan is not None:  # activation_checkpoint.plan: as the plan says
        entry = prep.step_plan["by_path"].get(p.path)
        if entry is None:
            raise ValueError(f"hpac.hf: activation_checkpoint.plan {prep.step_plan['path']!r} has no layer "
                             f"{p.path!r} (it plans {', '.join(prep.step_plan['by_path'])}); allowed: a plan made for "
                             "this model")
        if _seed_plan(prep) is not None:  # Note [A plan file is a first plan]: wrapped by _fit_target
            p.budget = hpac.budget(bytes=0, cost="estimated")
            return
        if not entry["checkpointed"]:
            p.layer = "off"
            return
        # The plan's layers keep what their profile's ops plan within the bytes, weighed as the plan weighed them:
        # estimated costs (on this machine's roofline, or HPAC_ROOFLINE's rates).
        p.budget = hpac.budget(bytes=entry["budget_bytes"], cost="estimated")
        wrap_torch_checkpoint(p.module, p._context_fn(p.budget))
    elif p.layer != "off":  # selective or budget, whole layer; budget: one region per layer, as the C++ trainer
        if p.layer == "budget":
            p.budget = _budget_of(ac["memory_budget"], ac.get("cost", "measured"))
        wrap_torch_checkpoint(p.module, p._context_fn(p.budget or _selective_policy(p.layer, ac)))
    p.submodules = list(lp["submodules"])
    for name in p.submodules:
        wrap_torch_checkpoint(p.module._modules[name], p._context_fn("full"))


def _read_step_plan(prep, model, config):
    """activation_checkpoint.plan: the plan file (relative to the YAML's folder), checked against this model and
    config (check_plan), and a guard on the batch shapes of each call (hpac/_step_record.py: the plan file is read
    there, never through hpac.plan, which imports this module)."""
    path = config["activation_checkpoint"].get("plan")
    if not path:
        return
    path = path["path"] if isinstance(path, dict) else path
    source = config.get("file")
    if not os.path.isabs(path) and source and os.path.isfile(source):
        path = os.path.join(os.path.dirname(os.path.abspath(source)), path)
    data = _step_record.load(path)
    _step_record.check_plan(data, path, model, config, prep.warn)
    prep.step_plan = {"path": path, "data": data, "by_path": {layer["path"]: layer for layer in data["layers"]},
                      "guard": _step_record.shape_guard(model, data, path)}
    prep.info(f"activation_checkpoint.plan {path}: {sum(1 for layer in data['layers'] if layer['checkpointed'])} "
              f"of {len(data['layers'])} layers checkpointed as planned for {(data.get('device') or {}).get('name')} x "
              f"{data['world_size']}, predicted {data['predicted_bytes'] / (1 << 30):.3f} GiB per rank")


def _seed_plan(prep):
    """The plan file's record where it names a target (it then runs as one: Note [A plan file is a first plan],
    policy/step_target.cpp); None without a plan file, or for one made without a target (fixed budgets)."""
    data = prep.step_plan["data"] if prep.step_plan is not None else None
    return data if data is not None and data.get("target_bytes") else None


def _fit_target(prep, model, ac):
    """activation_checkpoint.memory_target: the budget layers planned together under the whole step's target
    (hpac.MemoryTarget, plugin/python/hpac/_target.py), measured at the root model's calls."""
    target = ac.get("memory_target")
    seed = _seed_plan(prep)
    if seed is not None:  # Note [A plan file is a first plan] (policy/step_target.cpp): the file's target and plan
        target = {"bytes": seed["target_bytes"], "text": _target.format_bytes(seed["target_bytes"]),
                  "where": f"activation_checkpoint.plan {prep.step_plan['path']}"}
    layers = [p for p in prep.layers if p.layer == "budget" and p.budget is not None]
    if not target or not layers:
        return
    if prep.discovery is not None and prep.discovery.vision() is not None:
        raise ValueError(f"hpac.hf: activation_checkpoint.memory_target ({target['where']}) plans the layers in the "
                         "order the forward runs them, once each per step; a model with a vision tower runs its "
                         "vision layers first, which this order does not say yet; allowed: a language-only model")
    if prep.compiled or any(p.compiled for p in layers):
        raise ValueError(f"hpac.hf: activation_checkpoint.memory_target ({target['where']}) plans from eager "
                         "profiles; allowed only with train.compile: false")
    entries = [(p.path, p.module, p.budget, functools.partial(_torch_checkpointed, p._context_fn(p.budget)))
               for p in layers]
    prep.target = hpac.MemoryTarget(model, entries, target["bytes"],
                                    lambda level, message: (prep.warn if level == "warning" else prep.info)(message))
    if seed is not None:
        prep.target.seed(seed, prep.step_plan["path"])
    prep.info(f"memory target {target['text']}: step 1 profiles every layer (all recomputed), the plan for the whole "
              "step is made at step 2's start" + (f" from {prep.step_plan['path']}, checked against the profile"
                                                  if seed is not None else ""))


def _selective_policy(layer_mode, ac):
    """What a selective layer runs: activation_checkpoint.policy with its policy_params (validated by the C++
    parser), or the built-in rules."""
    policy = ac.get("policy", "selective")
    if layer_mode != "selective" or policy == "selective":
        return layer_mode
    return hpac.PolicySpec(policy, ac.get("policy_params", []))


def _compile_layers(prep, layers, backend):
    """train.compile: each layer compiled after wrapping, in place (module.compile(): the module object and its
    state_dict keys stay; torch.compile(module) would add an _orig_mod. prefix), as torchtitan applies checkpointing,
    then compile per block. Layers of one shape share one graph (Note [context_fn under torch.compile])."""
    for layer in layers:  # discovered layer refs or PreparedLayers: each has .module and .path
        layer.module.compile(backend=backend)
        prep.compiled.append(layer.path)
        prep._compiled_modules.append(layer.module)
    prep.info(f"compiled {len(prep.compiled)} layers with {backend} (module.compile() per layer, after wrapping; the "
              "checkpointed layers' policy tags the traced graph and the compiler recomputes)")
    if getattr(getattr(prep.discovery.inner_model, "config", None), "_experts_implementation", None) == "eager":
        prep.warn("the model's experts use the eager loop (experts_implementation 'eager'), whose data-dependent "
                  "shapes break the graph: each layer then runs eagerly; build it with experts_implementation="
                  "'batched_mm' or 'grouped_mm' to compile the MoE layers")


def unprepare(model: torch.nn.Module, prep: "Preparation") -> None:
    """Undoes prepare's wrapping and compiling of `model` (use_cache is left as prepare set it)."""
    if prep.target is not None:
        prep.target.remove()
    if prep.step_plan is not None:
        prep.step_plan["guard"].remove()
    for module in prep._compiled_modules:
        module._compiled_call_impl = None  # undoes module.compile()
    for p in prep.layers:
        unwrap_checkpoint(p.module)
        for name in p.submodules:
            unwrap_checkpoint(p.module._modules[name])
    if prep._native_model is not None:
        native = prep._native_model
        (native.activation_checkpointing_disable if hasattr(native, "activation_checkpointing_disable")
         else native.gradient_checkpointing_disable)()
