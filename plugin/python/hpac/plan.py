"""Plan for the machine you will train on, from the one you have (docs/python.md, "Plan for the machine you will
train on"): `python -m hpac plan CONFIG --memory-target 70GiB --world-size 8 --device h100-sxm --out plan.json`.

The trainer YAML's model is built on the meta device at the YAML's shapes: its tensors have sizes and no data, so
nothing of the model's bytes is allocated, and hpac counts the bytes each meta tensor would hold as it counts CPU
tensors (Note [Meta tensors are counted], replay/tracking_allocator.h). Then the steps a memory target runs —
step 1 profiles every layer (all recomputed), step 2 starts with the plan of the whole step (policy/step_target.h),
step 3 measures it — run as on a real machine, through hpac.hf.prepare, with each op's recompute time estimated
on the named device's datasheet (Note [A device that is not here], replay/op_cost.h). The plan that comes out is
the one a real run with the same target would make, for the bytes one rank holds (Note [One rank of a sharded
step]), and it travels as a file: `activation_checkpoint.plan: plan.json` in the YAML applies it (hpac.hf.prepare),
refusing it when the model, the shapes, the dtype or the world size differ.

What cannot run on the meta device is replaced, and the plan says so in its `notes`:
  * MoE routing (which tokens each expert gets) depends on values: each expert gets the expected uniform load,
    ceil(tokens x top_k / experts) tokens (Note [Uniform expert load]);
  * transformers' check for packed sequences reads values: a batch of unpacked sequences is assumed (what a run
    without position_ids gets).
"""
import contextlib
import functools
import gc
import json
import math
import os
import time
from typing import Any, Callable, Dict, List, Optional, Sequence, Union

import torch

from . import _devices, hf
from ._budget import budget
from ._step_record import (FORMAT, PlanError, _nbytes, format_size, holders, load, plot, report_text, run_report,
                           step_record)
from ._target import MemoryTarget, MemoryTargetError, _hpac_checkpointed, _Meter, parse_bytes

__all__ = ["plan", "load", "report_text", "plot", "holders", "run_report", "PlanError", "FORMAT"]


# Note [One rank of a sharded step]
# The meta step runs the whole model in one process; FSDP2 over W ranks (fully_shard per decoder layer and on the
# root, reshard_after_forward on the layers, as torchtitan applies it) holds per rank, at an event e of the step
# (Note [The step's peak as events], policy/step_plan.h) whose meta peak is M_e:
#   M_e - (1 - 1/W) (P + O + G_e)            parameters P, optimizer state O and the gradients G_e of the layers
#                                             whose backward is done (reduce-scattered) are sharded;
#       + (1 - 1/W) P_root                   the root's parameters (embedding, final norm, output) stay unsharded
#                                             from its forward to its backward (FSDP2 does not reshard the root);
#       + k_e P_layer                        all-gathered layer parameters: the layer running and the one prefetched
#                                             (k = 2 in a layer's forward or backward, 1 between layers, 0 in the
#                                             rest: embedding backward and optimizer step).
# The gradients a layer's backward produces count whole until its reduce-scatter (as the meta step holds them); G_e
# is read when the event opens, so gradients finished inside it count whole: an upper bound. The root's gradients
# count whole (reduced at the end of the backward). Not modelled: tensor, expert and context parallelism (refused),
# FSDP2's mixed precision (every tensor in train.dtype), communication buffers beyond the all-gathered parameters,
# the allocator's fragmentation. W = 1 is the meta step as measured.
class _RankView:
    """The meter (MemoryTarget.measure_with) of one rank of the meta step: the meta device's counters, less what the
    other ranks hold (above)."""

    def __init__(self, model: torch.nn.Module, layers: Sequence[torch.nn.Module], optimizer: Any, world: int,
                 offset: int):
        self.world, self.offset, self.optimizer = world, offset, optimizer
        self.share = 1.0 - 1.0 / world
        self.meta = _Meter(torch.device("meta"))
        layer_params = [list(layer.parameters()) for layer in layers]
        in_layers = {id(p) for ps in layer_params for p in ps}
        self.layer_params = [p for ps in layer_params for p in ps]
        self.params = sum(_nbytes(p) for p in model.parameters())
        self.root = sum(_nbytes(p) for p in model.parameters() if id(p) not in in_layers)
        self.layer_max = max((sum(_nbytes(p) for p in ps) for ps in layer_params), default=0)
        self._grads_open = 0  # the layers' gradients when the event open now opened

    def sharded(self, n: int) -> int:
        return int(n / self.world)

    def _state(self) -> int:
        if self.optimizer is None:
            return 0
        return sum(_nbytes(v) for s in self.optimizer.state.values() for v in s.values() if isinstance(v, torch.Tensor))

    def _layer_grads(self) -> int:
        return sum(_nbytes(p.grad) for p in self.layer_params if p.grad is not None)

    def current(self) -> int:
        live = self.meta.current()
        if self.world == 1:
            return live - self.offset
        return int(live - self.offset - self.share * (self.params + self._state() + self._layer_grads()))

    def take_peak(self, event) -> int:
        """The meta peak of the event closing now (`event`: its (kind, layer), as StepDriver's open_event gives it)
        as one rank holds it; the next event opens now."""
        peak = self.meta.take_peak()
        kind, _ = event
        if not kind or self.world == 1:
            out = peak - self.offset
        else:
            k = 0 if kind == "rest" else 2 if kind in ("forward", "backward") else 1
            sharded = self.share * (self.params + self._state() + self._grads_open)
            out = int(peak - self.offset - sharded + self.share * self.root + k * self.layer_max)
        if self.world > 1:
            self._grads_open = self._layer_grads()
        return out

    def take_fragmentation(self) -> int:
        return 0


# Note [Uniform expert load]
# transformers' eager experts loop over the experts the routing hit (`nonzero` of the routing mask) and gather each
# one's tokens (`where`): how many, a value. On the meta device each expert instead gets ceil(T k / E) tokens (T
# tokens, top-k routing, E experts: the expected load when routing is uniform), through the same ops on index
# tensors of that size (index, linear, activation, linear, weighting, index_add_), so the step holds and computes
# what a uniformly routed step does. A skewed routing holds more in the experts that get more tokens; the real run's
# measured events correct the bases a plan rests on (Note [Profile, then absolute bases]).
def _uniform_experts_forward(self, hidden_states, top_k_index, top_k_weights):
    tokens, top_k = top_k_index.shape
    n = math.ceil(tokens * top_k / self.num_experts)
    final = torch.zeros_like(hidden_states)
    with torch.no_grad():
        torch.nn.functional.one_hot(top_k_index, num_classes=self.num_experts + 1).permute(2, 1, 0)
    for e in range(self.num_experts):
        token_idx = torch.empty(n, dtype=torch.long, device=hidden_states.device)
        top_k_pos = torch.empty(n, dtype=torch.long, device=hidden_states.device)
        gate, up = torch.nn.functional.linear(hidden_states[token_idx], self.gate_up_proj[e]).chunk(2, dim=-1)
        h = torch.nn.functional.linear(self.act_fn(gate) * up, self.down_proj[e])
        h = h * top_k_weights[token_idx, top_k_pos, None]
        final.index_add_(0, token_idx, h.to(final.dtype))
    return final


# Note [Grouped matmul shapes on meta]
# torch's meta function for aten::_grouped_mm accepts bfloat16 only (what its CUDA kernel takes), while the CPU
# kernel also runs float32: a float32 model would trace on CPU but not on meta. While a float32 (or float16) step is
# traced, hpac puts its own meta function on the op, the output's shape from torch's four cases (offs along the
# dimension the 2-d operand groups) in out_dtype or the first operand's dtype, and takes it off after.
def _grouped_mm_meta(a, b, offs=None, bias=None, out_dtype=None):
    dtype = out_dtype or a.dtype
    if a.dim() == 2 and b.dim() == 2:
        shape = (offs.shape[0], a.shape[0], b.shape[1])
    elif a.dim() == 2:
        shape = (a.shape[0], b.shape[-1])
    elif b.dim() == 2:
        shape = (a.shape[1], b.shape[1])
    else:
        shape = (a.shape[0], a.shape[1], b.shape[-1])
    return torch.empty(shape, dtype=dtype, device="meta")


# Note [Attention on meta as on CPU]
# scaled_dot_product_attention picks its kernel per device (a dispatch stub no meta kernel has): on the meta device
# it takes the math path, which materialises the B x H x L x L scores and keeps them for backward, where CPU and
# CUDA run a flash kernel that keeps the output and its log-sum-exp. While a step is traced, a meta call asks the
# CPU's choice (torch.ops.hpac.sdp_choice: aten::_fused_sdp_choice on CPU stand-ins of the same heads, head size,
# dtype and flags, four positions, outside the region) and, where it is the flash kernel, calls the op a CPU step
# runs, aten::_scaled_dot_product_flash_attention_for_cpu (its meta function gives the shapes; on CUDA the flash
# kernel keeps the same two tensors); other choices run as torch runs them on meta.
_FLASH = 1  # sdp::SDPBackend::flash_attention


def _sdpa_as_on_cpu(original):
    def sdpa(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False, **kwargs):
        if q.is_meta and not kwargs:
            choice = torch.ops.hpac.sdp_choice(
                list(q.shape), list(k.shape), list(v.shape), q.dtype,
                None if attn_mask is None else list(attn_mask.shape), None if attn_mask is None else attn_mask.dtype,
                dropout_p, is_causal, scale, enable_gqa)
            if choice == _FLASH:
                return torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
                    q, k, v, dropout_p, is_causal, attn_mask=attn_mask, scale=scale)[0]
        return original(q, k, v, attn_mask=attn_mask, dropout_p=dropout_p, is_causal=is_causal, scale=scale,
                        enable_gqa=enable_gqa, **kwargs)
    return sdpa


@contextlib.contextmanager
def _quiet_override():
    import warnings
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*[Oo]verrid.*")
        yield


@contextlib.contextmanager
def _traceable(model: torch.nn.Module, notes: List[str]):
    """The model's value-dependent parts replaced for the meta device while the block runs (the notes say which)."""
    experts = [m for m in model.modules() if type(m).__name__.endswith("Experts") and hasattr(m, "gate_up_proj")]
    impls = {getattr(getattr(m, "config", None), "_experts_implementation", None) or "eager" for m in experts}
    patched = [m for m in experts if (getattr(getattr(m, "config", None), "_experts_implementation", None)
                                      or "eager") == "eager"]
    for m in patched:
        m.forward = _uniform_experts_forward.__get__(m)
    if patched:
        e, k = patched[0].num_experts, getattr(model.config, "num_experts_per_tok", "k")
        notes.append(f"MoE routing is value-dependent: each of the {e} experts of {len(patched)} layers gets the "
                     f"expected uniform load, ceil(tokens x {k} / {e}) tokens (Note [Uniform expert load])")
    for impl in sorted(impls - {"eager"}):
        notes.append(f"MoE experts run transformers' {impl!r} implementation as is: tokens sorted by expert, one "
                     "grouped matmul per weight; the routing moves no byte of the step (sizes are tokens x top_k)")
    meta_kernels = torch.library.Library("aten", "IMPL")
    if "grouped_mm" in impls and any(p.dtype != torch.bfloat16 for m in experts for p in m.parameters()):
        with _quiet_override():
            meta_kernels.impl("_grouped_mm", _grouped_mm_meta, "Meta")  # Note [Grouped matmul shapes on meta]
    meta_ops = torch.ops.hpac.meta_ops_in_regions(True)  # Note [Meta ops are not the region's], plugin/fallback.cpp
    sdpa = torch.nn.functional.scaled_dot_product_attention
    torch.nn.functional.scaled_dot_product_attention = _sdpa_as_on_cpu(sdpa)  # Note [Attention on meta as on CPU]
    import transformers.masking_utils as masking
    original = getattr(masking, "find_packed_sequence_indices", None)
    if original is not None:
        masking.find_packed_sequence_indices = lambda ids: None if ids.is_meta else original(ids)
        notes.append("transformers' packed-sequence check reads position values: unpacked sequences assumed")
    try:
        yield
    finally:
        for m in patched:
            m.__dict__.pop("forward", None)
        if original is not None:
            masking.find_packed_sequence_indices = original
        meta_kernels._destroy()
        torch.nn.functional.scaled_dot_product_attention = sdpa
        torch.ops.hpac.meta_ops_in_regions(meta_ops)


def _source(config: Union[str, os.PathLike, dict]) -> dict:
    """The trainer YAML as written (a path, or a dict as the YAML would be), checked by the C++ parser first."""
    if isinstance(config, dict):
        if "file" in config:
            raise PlanError("hpac plan: config is a dict the parser made (it has 'file'); allowed: the YAML's path, "
                            "or a dict as the YAML would be written")
        hf.parse_config(json.dumps(config, indent=1), "<the dict given to hpac.plan>")
        return json.loads(json.dumps(config))
    hf.load_config(config)  # its errors name the file, line and column
    import yaml  # transformers' own dependency
    with open(os.fspath(config), encoding="utf-8") as f:
        return yaml.load(f, Loader=_yaml_loader()) or {}


@functools.lru_cache(maxsize=None)
def _yaml_loader():
    """PyYAML's safe loader with YAML 1.2's booleans, as yaml-cpp (the C++ parser) reads them: `mode: off` is the
    text 'off', not False."""
    import re
    import yaml

    class Loader(yaml.SafeLoader):
        pass
    bool_tag = "tag:yaml.org,2002:bool"
    Loader.yaml_implicit_resolvers = {k: [r for r in v if r[0] != bool_tag]
                                      for k, v in yaml.SafeLoader.yaml_implicit_resolvers.items()}
    Loader.add_implicit_resolver(bool_tag, re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$"), list("tTfF"))
    return Loader


# The activation_checkpoint keys a plan replaces with its own (mode budget, the target, estimated costs).
_PLAN_REPLACES = ("mode", "memory_budget", "memory_target", "plan", "layers", "cost", "policy", "policy_params")


def _planned_config(source: dict, target_text: str, name: str) -> dict:
    """The config hf.prepare applies while planning: the user's, with activation_checkpoint's mode budget under the
    target (estimated costs: the device is not here), checked by the same C++ parser as any other."""
    ac = {k: v for k, v in (source.get("activation_checkpoint") or {}).items() if k not in _PLAN_REPLACES}
    ac.update(mode="budget", memory_target=target_text, cost="estimated")
    return hf.parse_config(json.dumps(dict(source, activation_checkpoint=ac), indent=1), f"<hpac plan of {name}>")


@contextlib.contextmanager
def _process_kept_as_found():
    """Note [plan() leaves the process as it found it]
    What plan() changes for its steps on the meta device is put back when it returns or raises: the meta device's
    allocator (Note [Meta tensors are counted]), the rooflines (the meta device's is the named device's datasheet),
    the CPU and CUDA random number generators (the meta model is built from a seed), transformers' logging level.
    _traceable puts back what it patches for the steps (the fallback's meta flag among them)."""
    import transformers
    verbosity = transformers.logging.get_verbosity()
    devices = list(range(torch.cuda.device_count())) if torch.cuda.is_initialized() else []
    meta_was = torch.ops.hpac.track_meta_memory(True)
    saved = torch.ops.hpac.save_rooflines()
    try:
        with torch.random.fork_rng(devices=devices):
            transformers.logging.set_verbosity_error()
            yield
    finally:
        gc.collect()  # the meta models (their hooks make cycles): their bytes leave the tracker's counters
        torch.ops.hpac.restore_rooflines(saved)
        torch.ops.hpac.track_meta_memory(meta_was)
        transformers.logging.set_verbosity(verbosity)


def _world(cfg: dict, world_size: Optional[int]) -> int:
    par = cfg.get("parallel") or {}
    for key in ("tp", "ep", "cp"):
        if par.get(key, 1) != 1:
            raise PlanError(f"hpac plan: parallel.{key}: {par[key]} in {cfg.get('file')}: a plan models FSDP2 data "
                            "parallelism (the shard degree) only; allowed: parallel.dp with fsdp, or --world-size")
    if world_size is None:
        return par.get("dp", 1) if par.get("fsdp") else 1
    if isinstance(world_size, bool) or not isinstance(world_size, int) or world_size < 1:
        raise PlanError(f"hpac plan: world size {world_size!r}; allowed: an int >= 1 (the FSDP2 shard degree)")
    return world_size


def _meta_model(cfg: dict, dtype: torch.dtype, seq: int) -> torch.nn.Module:
    from . import _models as models
    spec = cfg["model"]
    if not str(spec.get("preset", "")).startswith("qwen3_moe"):
        raise PlanError(f"hpac plan: model.preset {spec.get('preset')!r}; allowed: a qwen3_moe preset (the "
                        "transformers Qwen3MoeForCausalLM hpac builds from the YAML's model section)")
    return models.qwen3_moe_model(spec, 0, dtype=dtype, device="meta", max_position_embeddings=max(4096, seq))


class _Run:
    """One meta model of the config, ready to step: model, optimizer, input, the view of one rank."""

    def __init__(self, cfg: dict, world: int, notes: List[str]):
        tr = cfg["train"]
        self.batch, self.seq = tr["micro_batch"], tr["seq_len"]
        self.dtype = getattr(torch, tr["dtype"])
        gc.collect()  # an earlier run's model freed now, not in the middle of this one's steps
        self.offset = torch.ops.hpac.memory_stats()["current_bytes"]  # what the process held before: not the step's
        self.model = _meta_model(cfg, self.dtype, self.seq)
        self.notes, self.world = notes, world
        self.ids = torch.zeros(self.batch, self.seq, dtype=torch.long, device="meta")
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=tr["lr"], weight_decay=tr["weight_decay"])

    def view(self, layers: Sequence[torch.nn.Module]) -> _RankView:
        return _RankView(self.model, layers, self.optimizer, self.world, self.offset)

    def steps(self, n: int, log: Callable[[str], None], what: str) -> None:
        with _traceable(self.model, []):
            for k in range(n):
                t0 = time.perf_counter()
                loss = self.model(input_ids=self.ids, labels=self.ids, use_cache=False).loss
                loss.backward()
                self.optimizer.step()
                self.optimizer.zero_grad(set_to_none=True)
                log(f"{what}: step {k + 1} of {n} on the meta device in {time.perf_counter() - t0:.1f} s")


def plan(config: Union[str, os.PathLike, dict], memory_target: Union[int, str, None] = None, *,
         world_size: Optional[int] = None, device: Union[str, os.PathLike, "_devices.DeviceSpec", None] = None,
         modes: Sequence[str] = (), out: Union[str, os.PathLike, None] = None,
         log: Optional[Callable[[str], None]] = None) -> Dict[str, Any]:
    """The whole step's plan for the trainer YAML `config`, made on the meta device (module docstring). Leaves the
    process as it found it (Note [plan() leaves the process as it found it]).

    Args:
        config: the hpac-train YAML (its path, or a dict as the YAML would be written): model (a qwen3_moe preset),
            train.seq_len, micro_batch, dtype, lr, weight_decay; parallel.dp with fsdp gives the world size.
        memory_target: the most bytes one rank may hold (an int, or a size: '70GiB'); default:
            activation_checkpoint.memory_target, else the device's memory.
        world_size: the FSDP2 shard degree (default: parallel.dp with fsdp, else 1).
        device: a shipped spec name or a YAML file (hpac._devices); default 'h100-sxm'.
        modes: fixed modes to measure beside the plan, per rank ('off', 'full', 'selective').
        out: write the plan file here (JSON; `activation_checkpoint.plan` applies it; hpac.plan.load reads it).
        log: called with each progress line (default: none).

    Returns:
        the plan file's content (FORMAT; see docs/python.md for its keys).
    """
    say = log or (lambda line: None)
    source = _source(config)
    cfg = hf.parse_config(json.dumps(source, indent=1), str(config) if not isinstance(config, dict) else "<dict>")
    world = _world(cfg, world_size)
    spec = _devices.device_spec(device or "h100-sxm")
    if memory_target is None:
        t = cfg["activation_checkpoint"].get("memory_target")
        memory_target = t["text"] if t else spec.memory_bytes
    target = parse_bytes(memory_target)
    planned = _planned_config(source, f"{target}B" if isinstance(memory_target, int) else memory_target,
                              cfg.get("file") or "the dict given")
    if modes:
        for mode in modes:
            _check_mode(mode)
    t0 = time.perf_counter()
    with _process_kept_as_found():
        _devices.set_meta_roofline(spec)
        result = _plan_on_meta(planned, world, spec, target, say)
        if modes:
            result["modes"] = {mode: _mode_peak(planned, world, mode, say) for mode in modes}
    result["config"] = cfg.get("file")
    result["made_by"]["seconds"] = round(time.perf_counter() - t0, 2)
    if out is not None:
        with open(os.fspath(out), "w", encoding="utf-8") as f:
            json.dump(result, f, indent=1)
            f.write("\n")
    return result


def _plan_on_meta(cfg: dict, world: int, spec: "_devices.DeviceSpec", target: int,
                  say: Callable[[str], None]) -> Dict[str, Any]:
    """The plan's three meta steps under hf.prepare's memory target, measured as one rank holds them: the record."""
    notes: List[str] = []
    run = _Run(cfg, world, notes)
    say(f"hpac plan: {cfg['model'].get('preset')} with {run.model.config.num_hidden_layers} layers, micro-batch "
        f"{run.batch} x seq {run.seq}, {cfg['train']['dtype']}, world size {world}, device {spec.name}, target "
        f"{format_size(target)}")
    messages: List[Dict[str, str]] = []
    with _traceable(run.model, notes):
        prep = hf.prepare(run.model, cfg, log=lambda level, m: messages.append({"level": level, "text": m}))
        if prep.target is None:
            raise PlanError("hpac plan: the model's layers were not found (hpac.hf's discovery); nothing to plan")
        prep.target.measure_with(run.view(prep.target.modules))
        prep.target.watch_optimizer(run.optimizer)
        try:
            run.steps(2, say, "plan")  # the profile, then the first step under the plan
            prep.take_layer_stats()
            run.steps(1, say, "plan (measured)")
        except MemoryTargetError as e:
            raise PlanError(str(e)) from None
        stats = prep.take_layer_stats()
    uniform = prep.target.uniform_plans()
    return step_record(run.model, prep.target, prep.layers, stats, world=world, batch=run.batch, seq=run.seq,
                       dtype=run.dtype, device=spec.as_dict(), messages=messages, notes=notes,
                       floor_bytes=min((u["predicted_bytes"] for u in uniform if u["candidate"] > 0), default=None))


def _check_mode(mode: str) -> None:
    if mode not in ("off", "full", "selective"):
        raise PlanError(f"hpac plan: mode {mode!r}; allowed: off, full, selective")


def _mode_peak(cfg: dict, world: int, mode: str, say: Callable[[str], None]) -> Dict[str, Any]:
    """A fixed mode's step on the meta device, as one rank holds it: (peak, the event that sets it). Every layer
    of hpac.hf's discovery is hpac.checkpoint'ed with `mode` ('off': none is)."""
    _check_mode(mode)
    run = _Run(cfg, world, [])
    layers = [ref.module for c in hf.discover(run.model).containers for ref in c.layers]
    call = None if mode == "off" else functools.partial(_hpac_checkpointed, mode)
    entries = [(f"layer {i}", m, budget(bytes=0), call) for i, m in enumerate(layers)]
    target = MemoryTarget(run.model, entries, 0, measure_only=True)
    target.measure_with(run.view(layers))
    target.watch_optimizer(run.optimizer)
    run.steps(2, say, mode)
    last = target.history[-1]
    target.remove()
    return {"peak_bytes": last["measured_bytes"], "event": last["measured_event"]}


