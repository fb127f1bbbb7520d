"""hpac for Hugging Face transformers models: the trainer's rules (docs/trainer.md) applied in Python.

    import hpac.hf
    prep = hpac.hf.prepare(model, "train.yaml")    # or a dict from hpac.hf.load_config / parse_config
    ...train...
    stats = prep.take_layer_stats()                # per prepared layer: hpac's counters of its finished calls

The YAML is the hpac-train one, parsed and validated by the C++ parser (libhpac_config.so, torch.ops.hpac_config),
so errors carry the same `file:line:col`. The registry is the trainer's (tools/trainer/model_registry.yaml), read by
the same C++ code. Python only walks the module tree and wraps: the policy, the counting and the replay run in
libhpac.so, through `context_fn` regions of torch.utils.checkpoint (non-reentrant).

Routing, as in the C++ trainer (tools/trainer/routing.cpp):
  off        nothing is touched.
  selective  every discovered layer (both towers) checkpointed whole with hpac's selective policy.
  budget     as selective, with the memory-budget policy: one hpac.budget(memory_budget) per layer (its region:
             profiled on the layer's first call, its plan replayed after); PreparedLayer.budget.status() shows it.
  full       one route, decided in this order (Note [Full decision order] in routing.cpp):
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

import torch
import torch.utils.checkpoint

import hpac
from hpac._wrap import unwrap_checkpoint, wrap_forward

__all__ = [
    "load_config_library", "load_config", "parse_config", "load_registry", "discover", "prepare", "Preparation",
    "Discovery", "unprepare",
]

_lock = threading.Lock()
_ROLE_ORDER = ("language", "vision")


def _config_ops_present():
    return hpac._ops_present("hpac_config", "load_config")


def load_config_library(path=None):
    """Makes torch.ops.hpac_config available: `path`, else $HPAC_CONFIG_LIBRARY, else libhpac_config.so of the
    build that serves libhpac.so (<build>/tools/trainer/). Returns the path loaded (None if already present)."""
    with _lock:
        if _config_ops_present():
            return None
        candidate = path or os.environ.get("HPAC_CONFIG_LIBRARY")
        if not candidate:
            build = os.path.dirname(os.path.dirname(hpac.load()))
            candidate = os.path.join(build, "tools", "trainer", "libhpac_config.so")
        if not os.path.exists(candidate):
            raise RuntimeError(f"hpac.hf: libhpac_config.so not found at '{candidate}'; build the trainer "
                               "(tools/build.sh, HPAC_WITH_TRAINER=ON) or set HPAC_CONFIG_LIBRARY to its path")
        torch.ops.load_library(candidate)
        return candidate


def load_config(path):
    """The hpac-train YAML at `path`, validated by the C++ parser, as a dict (Note [Config JSON] in
    tools/trainer/config_ops.cpp). Bad input raises RuntimeError with file:line:col."""
    load_config_library()
    return json.loads(torch.ops.hpac_config.load_config(str(path)))


def parse_config(text, file="<string>"):
    load_config_library()
    return json.loads(torch.ops.hpac_config.parse_config(text, file))


def load_registry(path=None):
    """The model registry (default: the shipped tools/trainer/model_registry.yaml, or $HPAC_MODEL_REGISTRY)."""
    load_config_library()
    return json.loads(torch.ops.hpac_config.load_registry(str(path) if path else ""))


# ---------------------------------------------------------------------------------------------------------------
# Discovery (reference design 6.1; tools/trainer/discovery.cpp)

class LayerRef:
    __slots__ = ("path", "index", "module")

    def __init__(self, path, index, module):
        self.path, self.index, self.module = path, index, module


class Container:
    __slots__ = ("role", "path", "layers")

    def __init__(self, role, path, layers):
        self.role, self.path, self.layers = role, path, layers


class Discovery:
    def __init__(self, class_name):
        self.class_name = class_name
        self.how = ""
        self.containers = []
        self.tried = []
        self.inner_model = None  # the model reached through retrieval wrappers (the root otherwise)

    def _role(self, role):
        return next((c for c in self.containers if c.role == role), None)

    def language(self):
        return self._role("language")

    def vision(self):
        return self._role("vision")


def _numeric_key(key):
    return key.isdigit() and len(key) <= 9


def is_layer_container(module):
    """A non-empty ModuleList, or a ModuleDict whose keys are all non-negative integers."""
    if isinstance(module, torch.nn.ModuleList):
        return len(module) > 0
    if isinstance(module, torch.nn.ModuleDict):
        return len(module) > 0 and all(_numeric_key(k) for k in module.keys())
    return False


def resolve_path(root, path):
    at = root
    for part in path.split("."):
        at = at._modules.get(part)
        if at is None:
            return None
    return at


def _container(module, role, path):
    is_list = isinstance(module, torch.nn.ModuleList)
    layers = [LayerRef(f"{path}.{key}", position if is_list else int(key), child)
              for position, (key, child) in enumerate(module._modules.items())]
    return Container(role, path, layers)


def _first_container(root, paths, tried):
    for p in paths:
        tried.append(p)
        m = resolve_path(root, p)
        if m is not None and is_layer_container(m):
            return p, m
    return None, None


def discover(model, registry=None):
    """Finds the layer containers of `model` as tools/trainer/discovery.cpp does; raises LookupError listing every
    path tried when there is none."""
    registry = registry if registry is not None else load_registry()
    d = Discovery(type(model).__name__)
    inner_paths = registry["retrieval_wrappers"].get(d.class_name)
    if inner_paths is not None:
        for p in inner_paths:
            d.tried.append(p)
            inner = resolve_path(model, p)
            if inner is None:
                continue
            try:
                sub = discover(inner, registry)
            except LookupError as e:
                raise LookupError(f"retrieval wrapper {d.class_name} -> {p}: {e}") from None
            d.how = f"retrieval wrapper {d.class_name} -> inner model '{p}' ({sub.class_name}): {sub.how}"
            d.tried += [f"{p}.{t}" for t in sub.tried]
            for c in sub.containers:
                c.path = f"{p}.{c.path}"
                for layer in c.layers:
                    layer.path = f"{p}.{layer.path}"
                d.containers.append(c)
            d.inner_model = sub.inner_model
            return d
        raise LookupError(f"no layer container in {d.class_name}: it is a registered retrieval wrapper but none of "
                          f"its inner model paths exists; tried: {', '.join(d.tried)}")
    d.inner_model = model

    entry = registry["models"].get(d.class_name)
    if entry is not None:
        path, language = _first_container(model, entry["language"], d.tried)
        if language is None:
            raise LookupError(
                f"no layer container in {d.class_name} (registered, family {entry['family']}): none of its language "
                f"paths is a non-empty ModuleList or numeric-key ModuleDict; tried: {', '.join(d.tried)}. Registered "
                f"models do not fall back to heuristics: fix the entry in {registry['file']}")
        d.containers.append(_container(language, "language", path))
        d.how = f"registry: {d.class_name} (family {entry['family']}), language tower at {path}"
        vpath, vision = _first_container(model, entry["vision"], d.tried)
        if vision is not None:
            d.containers.append(_container(vision, "vision", vpath))
            d.how += f", vision tower at {vpath}"
        return d

    path, found = _first_container(model, registry["default_paths"], d.tried)
    if found is not None:
        d.containers.append(_container(found, "language", path))
        d.how = f"default path {path}"
        return d

    d.tried.append("largest ModuleList / numeric-key ModuleDict")
    best, best_params = None, -1
    for name, m in model.named_modules(remove_duplicate=False):
        if not name or not is_layer_container(m):
            continue
        n = sum(p.numel() for p in m.parameters())
        if n > best_params:
            best, best_params, path = m, n, name
    if best is None:
        raise LookupError(f"no layer container in {d.class_name} (not registered); tried: {', '.join(d.tried)} "
                          f"(none found). Register the class in {registry['file']}")
    d.containers.append(_container(best, "language", path))
    d.how = f"largest container {path} ({best_params} parameters)"
    return d


# ---------------------------------------------------------------------------------------------------------------
# Routing (reference design 6.2-6.4; tools/trainer/routing.cpp)

class PreparedLayer:
    def __init__(self, ref, role, mode, record_ops=False, rules=None):
        self.path, self.index, self.module, self.role, self.mode = ref.path, ref.index, ref.module, role, mode
        self.record_ops = record_ops  # keep each call's op log; take_stats adds it up as "log:<phase> <op> <action>"
        # activation_checkpoint.routing / .state_writes (replay/recompute_rules.h)
        self.rules = dict(rules or {"routing": "verify", "state_writes": "warn"})
        self.compiled = False     # train.compile: the layer is compiled after wrapping (module.compile())
        self.layer = "off"        # whole-layer checkpoint applied: off | full | selective | budget
        self.budget = None        # mode budget: this layer's hpac.Budget (its region's profile and plan)
        self.native = False       # through the model's own activation_checkpointing_enable
        self.submodules = []      # children checkpointed (full), by name
        self._invocations = []    # hpac Invocations of this layer's calls, until take_layer_stats()

    def _context_fn(self, policy):
        if self.compiled:
            # One context_fn per policy for every layer, so that layers of one shape share one compiled graph (Note
            # [context_fn under torch.compile]); compiled code runs no eager invocation to take stats from.
            return hpac.context_fn(policy, **self.rules)
        return hpac.context_fn(policy, on_invocation=self._on_invocation, record_ops=self.record_ops, **self.rules)

    def _on_invocation(self, inv):
        self._invocations.append(inv)
        inv.name_state(self.module, prefix=self.path)  # messages name the buffer a recompute writes again

    def take_stats(self):
        total = {}
        invocations = list(self._invocations)
        self._invocations.clear()  # in place: the layer's context_fn appends to this list
        for inv in invocations:
            for k, v in inv.stats().items():
                total[k] = total.get(k, 0) + v
            for line in inv.op_log():
                total["log:" + line] = total.get("log:" + line, 0) + 1
        total["invocations"] = len(invocations)
        return total


class Preparation:
    def __init__(self):
        self.touched = False
        self.discovery = None
        self.kv_sharing = False
        self.use_cache_disabled = []
        self.full_route = None
        self.full_route_reason = ""
        self.layers_wrapped = 0
        self.submodules_wrapped = 0
        self.layers = []
        self.compiled = []        # paths of the layers compiled (train.compile)
        self._compiled_modules = []
        self.messages = []
        self.warnings = []
        self._log = None
        self._native_model = None

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

    def take_layer_stats(self):
        """hpac's counters summed over each prepared layer's calls since the last take (call after backward)."""
        return [layer.take_stats() for layer in self.layers]


def log_to_stderr(level, message):
    print(f"[hpac] {'warning: ' if level == 'warning' else ''}{message}", file=sys.stderr)


def _configs(config, path="config"):
    """(path, config) for a transformers config and its sub-configs (text_config, vision_config, ...)."""
    yield path, config
    for key in sorted(getattr(config, "sub_configs", None) or {}):
        sub = getattr(config, key, None)
        if sub is not None and hasattr(sub, "to_dict"):
            yield from _configs(sub, f"{path}.{key}")


def _mode_of(ac, index):
    for r in ac["layers"]:
        if r["first"] <= index <= r["last"]:
            return r["mode"]
    return ac["mode"]


def _budget_of(memory_budget, cost="measured"):
    """A new region for activation_checkpoint.memory_budget and .cost (validated by the C++ parser: a fraction or
    bytes; measured or estimated)."""
    if memory_budget["bytes"] is not None:
        return hpac.budget(bytes=memory_budget["bytes"], cost=cost)
    return hpac.budget(memory_budget["fraction"], cost=cost)


def _all_off(ac):
    return ac["mode"] == "off" and all(r["mode"] == "off" for r in ac["layers"])


def _children_named(module, lists):
    return [name for names in lists for name in names if name in module._modules]


def _torch_checkpointed(context_fn, original, *args, **kwargs):
    if not torch.is_grad_enabled():
        return original(*args, **kwargs)
    return torch.utils.checkpoint.checkpoint(original, *args, use_reentrant=False, context_fn=context_fn, **kwargs)


def _wrap(module, context_fn):
    """torch.utils.checkpoint around module's forward with hpac's context_fn: the one wrap mechanism
    (hpac._wrap.wrap_forward, which hpac.checkpoint_wrapper uses too; unwrap_checkpoint undoes either)."""
    wrap_forward(module, functools.partial(_torch_checkpointed, context_fn))


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


def prepare(model, config, registry=None, log=log_to_stderr, record_ops=False, compile_backend="inductor"):
    """Applies activation_checkpoint (and activation_swap) of `config` (a path, or a dict from load_config) to
    `model` in place, then, with train.compile: true, compiles each layer (module.compile(backend=compile_backend)).
    Returns a Preparation (route, wrap counts, messages, per-layer stats). record_ops=True adds every region's op
    log to the per-layer stats, one count per "log:<phase> <op> <action>" key (hpac.Invocation's op_log lines:
    action saved, run, served, recomputed or ignored); compiled layers run no eager invocation and report none."""
    if not isinstance(config, dict):
        config = load_config(config)
    prep = Preparation()
    prep._log = log
    ac = config["activation_checkpoint"]
    if config["activation_swap"] == "attention" and not _all_off(ac):
        mode = ac["mode"] if ac["mode"] != "off" else "off with checkpointed layers in activation_checkpoint.layers"
        raise ValueError(f"{config['file']}: activation_checkpoint.mode: {mode} cannot be combined with "
                         "activation_swap: attention; set activation_swap: none, or activation_checkpoint.mode: off "
                         "(and no checkpointed layers)")
    compile_on = config["train"]["compile"]
    if _all_off(ac):
        if compile_on:
            reg = registry if registry is not None else load_registry()
            prep.discovery = discover(model, reg)
            _compile_layers(prep, [ref for c in prep.discovery.containers for ref in c.layers], compile_backend)
            return prep
        prep.info("activation checkpointing off: model left as is (no discovery, no wrapping, use_cache untouched)")
        if config["activation_swap"] == "attention":
            prep.warn("activation_swap: attention has nothing to swap to on a CPU-only build; it has no effect")
        return prep

    reg = registry if registry is not None else load_registry()
    d = prep.discovery = discover(model, reg)
    prep.touched = True
    prep.info(f"layer containers of {d.class_name}: {d.how}")
    language = d.language()
    held = [layer.index for layer in language.layers]
    for r in ac["layers"]:
        for i in range(r["first"], r["last"] + 1):
            if i not in held:
                raise ValueError(f"{r['where']}: activation_checkpoint.layers: layer {i} is out of range; the "
                                 f"language tower {language.path} holds layers {', '.join(map(str, held))}")

    hf_config = getattr(d.inner_model, "config", None)
    configs = list(_configs(hf_config)) if hf_config is not None else []
    shared = [(p, c.num_kv_shared_layers) for p, c in configs if (getattr(c, "num_kv_shared_layers", 0) or 0) > 0]
    prep.kv_sharing = bool(shared)
    if prep.kv_sharing:
        for p, n in shared:
            prep.info(f"KV sharing ({p}.num_kv_shared_layers = {n}): use_cache kept, attention is never checkpointed")
    else:
        for p, c in configs:
            c.use_cache = False
            prep.use_cache_disabled.append(p)
        prep.info(f"use_cache set false on {', '.join(prep.use_cache_disabled) or '(no config)'}")

    for c in sorted(d.containers, key=lambda c: _ROLE_ORDER.index(c.role)):
        for ref in c.layers:
            prep.layers.append(PreparedLayer(ref, c.role, _mode_of(ac, ref.index) if c.role == "language"
                                             else ac["mode"], record_ops,
                                             {"routing": ac["routing"], "state_writes": ac["state_writes"]}))

    if compile_on:
        budgeted = [p.index for p in prep.layers if p.mode == "budget"]
        if budgeted:
            raise ValueError(
                f"{config['file']}: activation_checkpoint mode budget (layers {', '.join(map(str, budgeted))}) cannot "
                "be combined with train.compile: true: hpac's budget plans from eager profiles of the layer, which "
                "compiled code never runs; use mode selective or full with compile, or train.compile: false")
        for p in prep.layers:
            p.compiled = True

    full = [p for p in prep.layers if p.mode == "full"]
    if full:
        not_native = []
        if any(not q.requires_grad for p in full for q in p.module.parameters()):
            not_native.append("some layers are frozen")
        if not all(_supports_native(p.module) for p in full):
            not_native.append("some layers are not transformers GradientCheckpointingLayers")
        if not getattr(d.inner_model, "supports_gradient_checkpointing", False):
            not_native.append("the model does not declare checkpointing support")
        if d.vision() is not None:
            prep.full_route, prep.full_route_reason = "submodules", "not language-tower-only: the model has a " \
                                                                    "vision tower"
        elif prep.kv_sharing:
            prep.full_route, prep.full_route_reason = "submodules", "KV sharing: attention must not be checkpointed"
        elif config["train"]["compile"]:
            prep.full_route, prep.full_route_reason = "compile", "compile is on: attention and MLP submodules only"
        elif not not_native:
            prep.full_route = "native"
            prep.full_route_reason = ("language tower only, no compile, every layer trainable and native, model "
                                      "supports it")
        else:
            prep.full_route, prep.full_route_reason = "submodules", "not native: " + ", ".join(not_native)
        prep.info(f"full: {prep.full_route} path ({prep.full_route_reason})")

    a = reg["aliases"]
    if prep.full_route == "native":
        _enable_native(d.inner_model)
        prep._native_model = d.inner_model
    warned_degrade = False
    for p in prep.layers:
        if p.mode == "off":
            if prep.full_route == "native" and hasattr(p.module, "gradient_checkpointing"):
                p.module.gradient_checkpointing = False  # the native enable turned every layer on
            continue
        subs = []
        if p.mode in ("selective", "budget") and not prep.kv_sharing:
            p.layer = p.mode
            if p.mode == "budget":  # one region per layer, as the C++ trainer
                p.budget = _budget_of(ac["memory_budget"], ac.get("cost", "measured"))
            _wrap(p.module, p._context_fn(p.budget or "selective"))
        elif p.mode in ("selective", "budget"):
            if not warned_degrade:
                prep.warn(f"{p.mode} with KV sharing degrades to submodule checkpointing (full) of the MLP and "
                          "norms; attention is not checkpointed")
                warned_degrade = True
            subs = _children_named(p.module, [a["mlp"], a["norm1"], a["norm2"], a["mtp"]])
        elif prep.full_route == "native":
            p.layer, p.native = "full", True
            # The model's own path (GradientCheckpointingLayer.__call__), with this layer's hpac region.
            p.module._gradient_checkpointing_func = functools.partial(
                torch.utils.checkpoint.checkpoint, use_reentrant=False, context_fn=p._context_fn("full"))
        elif prep.full_route == "compile":
            subs = _children_named(p.module, [a["attention"], a["mlp"]])
        elif prep.kv_sharing:
            subs = _children_named(p.module, [a["mlp"], a["norm1"], a["norm2"], a["mtp"]])
        else:
            subs = _children_named(p.module, [a["mlp"], a["attention"], a["norm1"], a["norm2"], a["mtp"]])
        for name in subs:
            _wrap(p.module._modules[name], p._context_fn("full"))
        p.submodules = subs
        prep.layers_wrapped += p.layer != "off"
        prep.submodules_wrapped += len(subs)

    planned = sum(p.mode != "off" for p in prep.layers)
    prep.info(f"wrapped {prep.layers_wrapped} layers whole and {prep.submodules_wrapped} submodules ({planned} of "
              f"{len(prep.layers)} layers planned non-off)")
    if prep.layers_wrapped + prep.submodules_wrapped == 0:
        prep.warn(f"0 modules wrapped: no layer of {d.class_name} could be checkpointed (submodule names outside the "
                  "alias lists); training runs without activation checkpointing")
    if compile_on:
        _compile_layers(prep, prep.layers, compile_backend)
    return prep


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


def unprepare(model, prep):
    """Undoes prepare's wrapping (use_cache is left as prepare set it)."""
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
