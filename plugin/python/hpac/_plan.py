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

from . import _devices

FORMAT = "hpac-step-plan 1"
_MODEL_KEYS = ("num_hidden_layers", "hidden_size", "num_attention_heads", "num_key_value_heads", "head_dim",
               "intermediate_size", "moe_intermediate_size", "num_experts", "num_experts_per_tok", "vocab_size",
               "norm_topk_prob", "rms_norm_eps")


class PlanError(ValueError):
    """A plan that cannot be made (a config it does not model, a target below the floor) or applied (made for
    another model, shapes, dtype or world size); the message names the difference and what is allowed."""


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
    def __init__(self, model: torch.nn.Module, layers: Sequence[torch.nn.Module], optimizer: Any, world: int,
                 offset: int):
        self.world, self.offset, self.optimizer = world, offset, optimizer
        self.share = 1.0 - 1.0 / world
        layer_params = [list(layer.parameters()) for layer in layers]
        in_layers = {id(p) for ps in layer_params for p in ps}
        self.layer_params = [p for ps in layer_params for p in ps]
        self.params = sum(_nbytes(p) for p in model.parameters())
        self.root = sum(_nbytes(p) for p in model.parameters() if id(p) not in in_layers)
        self.layer_max = max((sum(_nbytes(p) for p in ps) for ps in layer_params), default=0)
        self._grads_open = 0

    def sharded(self, n: int) -> int:
        return int(n / self.world)

    def _state(self) -> int:
        if self.optimizer is None:
            return 0
        return sum(_nbytes(v) for s in self.optimizer.state.values() for v in s.values() if isinstance(v, torch.Tensor))

    def _layer_grads(self) -> int:
        return sum(_nbytes(p.grad) for p in self.layer_params if p.grad is not None)

    def start(self, live: int) -> int:
        if self.world == 1:
            return live - self.offset
        return int(live - self.offset - self.share * (self.params + self._state() + self._layer_grads()))

    def opened(self, event) -> None:
        if self.world > 1:
            self._grads_open = self._layer_grads()

    def peak(self, event, peak: int) -> int:
        if event is None or self.world == 1:
            return peak - self.offset
        what, _, layer = event
        k = 0 if what == "the rest" else 2 if layer >= 0 else 1
        sharded = self.share * (self.params + self._state() + self._grads_open)
        return int(peak - self.offset - sharded + self.share * self.root + k * self.layer_max)


def _nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


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


def _config(config: Union[str, os.PathLike, dict]) -> dict:
    from . import hf
    if isinstance(config, dict):
        return config if "file" in config else hf.parse_config(json.dumps(config, indent=1), "<the dict given>")
    return hf.load_config(config)


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
    import transformers
    from . import _models as models
    spec = cfg["model"]
    if not str(spec.get("preset", "")).startswith("qwen3_moe"):
        raise PlanError(f"hpac plan: model.preset {spec.get('preset')!r}; allowed: a qwen3_moe preset (the "
                        "transformers Qwen3MoeForCausalLM hpac builds from the YAML's model section)")
    transformers.logging.set_verbosity_error()
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


def _model_identity(model: torch.nn.Module) -> Dict[str, Any]:
    cfg = model.config
    out = {"class": type(model).__name__}
    out.update({k: getattr(cfg, k) for k in _MODEL_KEYS if hasattr(cfg, k)})
    return out


def _result(cfg: dict, run: "_Run", prep, stats, spec, target: int, t0: float, messages, notes) -> Dict[str, Any]:
    """The plan file's content (FORMAT) from the plan's run and its Preparation, modes not yet measured."""
    world = run.world
    report = prep.target.report()
    uniform = prep.target.uniform_plans()
    return {
        "format": FORMAT,
        "made_by": {"hpac": _version(), "torch": torch.__version__, "seconds": round(time.perf_counter() - t0, 2)},
        "config": cfg.get("file"),
        "model": _model_identity(run.model),
        "shapes": {"micro_batch": run.batch, "seq_len": run.seq},
        "dtype": cfg["train"]["dtype"],
        "world_size": world,
        "device": spec.as_dict(),
        "memory_target_bytes": target,
        "predicted_bytes": report["predicted_bytes"],
        "predicted_event": report["predicted_event"],
        "meta_measured_bytes": report["history"][-1]["measured_bytes"] if report["history"] else None,
        "meta_measured_event": report["history"][-1]["measured_event"] if report["history"] else None,
        "recompute_micros": sum(layer["recompute_micros"] for layer in report["layers"] if layer["checkpointed"]),
        "floor_bytes": min((u["predicted_bytes"] for u in uniform if u["candidate"] > 0), default=None),
        "layers": [dict(layer, path=p.path, ops={k: st.get(k, 0) for k in ("saved", "recomputed", "served")})
                   for layer, p, st in zip(report["layers"], prep.layers, stats)],
        "events": report["events"],
        "fixed": _fixed_parts(run),
        "messages": messages,
        "notes": notes,
    }


def plan(config: Union[str, os.PathLike, dict], memory_target: Union[int, str, None] = None, *,
         world_size: Optional[int] = None, device: Union[str, os.PathLike, "_devices.DeviceSpec", None] = None,
         modes: Sequence[str] = (), out: Union[str, os.PathLike, None] = None,
         log: Optional[Callable[[str], None]] = None) -> Dict[str, Any]:
    """The whole step's plan for the trainer YAML `config`, made on the meta device (module docstring).

    Args:
        config: the hpac-train YAML (path or load_config dict): model (a qwen3_moe preset), train.seq_len,
            micro_batch, dtype, lr, weight_decay; parallel.dp with fsdp gives the world size.
        memory_target: the most bytes one rank may hold ('70GiB'); default: activation_checkpoint.memory_target,
            else the device's memory.
        world_size: the FSDP2 shard degree (default: parallel.dp with fsdp, else 1).
        device: a shipped spec name or a YAML file (hpac._devices); default 'h100-sxm'.
        modes: fixed modes to measure beside the plan, per rank ('off', 'full', 'selective').
        out: write the plan file here (JSON; `activation_checkpoint.plan` applies it).
        log: called with each progress line (default: none).

    Returns:
        the plan file's content (FORMAT; see docs/python.md for its keys).
    """
    from . import hf
    from ._target import MemoryTargetError, parse_bytes
    say = log or (lambda line: None)
    cfg = _config(config)
    world = _world(cfg, world_size)
    spec = _devices.device_spec(device or "h100-sxm")
    if memory_target is None:
        t = cfg["activation_checkpoint"].get("memory_target")
        memory_target = t["bytes"] if t else spec.memory_bytes
    target = parse_bytes(memory_target)
    torch.ops.hpac.track_meta_memory()
    _devices.set_meta_roofline(spec)
    notes: List[str] = []
    t0 = time.perf_counter()
    run = _Run(cfg, world, notes)
    say(f"hpac plan: {cfg['model'].get('preset')} with {run.model.config.num_hidden_layers} layers, micro-batch "
        f"{run.batch} x seq {run.seq}, {cfg['train']['dtype']}, world size {world}, device {spec.name}, target "
        f"{_gib(target)}")
    ac = dict(mode="budget", memory_budget=None, memory_target={"bytes": target, "text": str(memory_target),
              "where": "hpac plan"}, plan=None, cost="estimated", layers=[])
    prepared = dict(cfg, activation_checkpoint=dict(cfg["activation_checkpoint"], **ac))
    messages: List[Dict[str, str]] = []
    with _traceable(run.model, notes):
        prep = hf.prepare(run.model, prepared, log=lambda level, m: messages.append({"level": level, "text": m}),
                          _rank_view=run.view)
        if prep.target is None:
            raise PlanError("hpac plan: the model's layers were not found (hpac.hf's discovery); nothing to plan")
        prep.target.watch_optimizer(run.optimizer)
        try:
            run.steps(2, say, "plan")  # the profile, then the first step under the plan
            prep.take_layer_stats()
            run.steps(1, say, "plan (measured)")
        except MemoryTargetError as e:
            raise PlanError(str(e)) from None
        stats = prep.take_layer_stats()
    result = _result(cfg, run, prep, stats, spec, target, t0, messages, notes)
    del prep, run  # the plan's model and optimizer, before the modes' runs (each measures from its own start)
    if modes:
        result["modes"] = {mode: _mode_peak(cfg, world, mode, say) for mode in modes}
    gc.collect()  # the last meta model (its hooks make cycles) before the caller's own steps: meta bytes count in
    #               the tracker that a real run's memory target reads
    result["made_by"]["seconds"] = round(time.perf_counter() - t0, 2)
    if out is not None:
        with open(os.fspath(out), "w", encoding="utf-8") as f:
            json.dump(result, f, indent=1)
            f.write("\n")
    return result


def _version() -> str:
    from . import __version__
    return __version__


def _fixed_parts(run: _Run) -> Dict[str, int]:
    """What one rank holds besides activations, per top-level module and kind (Note [One rank of a sharded step]):
    parameters, gradients and AdamW's two moments, sharded over the world; the logits of one micro-batch."""
    w = run.world
    per_module: Dict[str, int] = {}
    for name, p in run.model.named_parameters():
        top = ".".join(name.split(".")[:2]) if name.startswith("model.") else name.split(".")[0]
        per_module[top] = per_module.get(top, 0) + _nbytes(p)
    cfg = run.model.config
    layer = max((sum(_nbytes(p) for p in m.parameters()) for m in run.model.model.layers), default=0)
    params = sum(per_module.values())
    return {"parameters": params // w, "gradients": params // w, "optimizer_state": 2 * params // w,
            "all_gathered_layers": 2 * layer if w > 1 else 0,
            "logits": run.batch * run.seq * cfg.vocab_size * torch.finfo(run.dtype).bits // 8,
            "per_module_parameters": {k: v // w for k, v in per_module.items()}}


def _mode_peak(cfg: dict, world: int, mode: str, say: Callable[[str], None]) -> Dict[str, Any]:
    """A fixed mode's step on the meta device, as one rank holds it: (peak, the event that sets it). Every layer
    of hpac.hf's discovery is hpac.checkpoint'ed with `mode` ('off': none is)."""
    from . import hf
    from ._budget import budget
    from ._target import MemoryTarget, _hpac_checkpointed
    if mode not in ("off", "full", "selective"):
        raise PlanError(f"hpac plan: mode {mode!r}; allowed: off, full, selective")
    run = _Run(cfg, world, [])
    layers = [ref.module for c in hf.discover(run.model).containers for ref in c.layers]
    call = None if mode == "off" else functools.partial(_hpac_checkpointed, mode)
    entries = [(f"layer {i}", m, budget(bytes=0), call) for i, m in enumerate(layers)]
    target = MemoryTarget(run.model, entries, 1 << 62, view=run.view(layers), measure_only=True)
    target.watch_optimizer(run.optimizer)
    run.steps(2, say, mode)
    last = target.history[-1]
    target.remove()
    return {"peak_bytes": last["measured_bytes"], "event": last["measured_event"]}


def _size(n: Optional[int]) -> str:
    if n is None:
        return "-"
    return f"{n / (1 << 30):.2f} GiB" if abs(n) >= 1 << 30 else f"{n / (1 << 20):.1f} MiB"


_gib = _size


def holders(result: Dict[str, Any], top: int = 5) -> List[Any]:
    """The largest holders of the step's bytes at its peak, largest first: (what, bytes) for the fixed parts and for
    each layer what it keeps (checkpointed: its plan's kept bytes; not: all it keeps, its off bytes)."""
    parts = [(k.replace("_", " "), v) for k, v in result["fixed"].items() if isinstance(v, int) and v > 0]
    parts += [(f"{x['path']} (kept)", x["kept_bytes"] if x["checkpointed"] else x["off_bytes"])
              for x in result["layers"]]
    return sorted(parts, key=lambda p: -p[1])[:top]


def report_text(result: Dict[str, Any]) -> str:
    """The whole-step report as a person reads it (a plan from plan(), or a real run's from run_report()): what
    it is for, the prediction and the measurement, the fixed parts, per layer its plan, what it keeps and holds,
    its ops saved / recomputed / served and its predicted recompute time, and, for a step over its target, the
    largest holders."""
    m, shapes = result["model"], result["shapes"]
    where = (f"on the meta device for {result['device']['name']} x {result['world_size']}" if result.get("device")
             else f"measured on {result.get('measured_on', 'this machine')}")
    lines = [f"hpac step report ({result['format']}): {m['class']} with {m.get('num_hidden_layers')} layers, "
             f"micro-batch {shapes['micro_batch']} x seq {shapes['seq_len']}, {result['dtype']}, {where}; torch "
             f"{result['made_by']['torch']}"]
    peak, target = result.get("meta_measured_bytes") or result["predicted_bytes"], result["memory_target_bytes"]
    lines.append(f"target {_size(target)}: predicted {_size(result['predicted_bytes'])} at "
                 f"{result['predicted_event']}; measured {_size(result.get('meta_measured_bytes'))} at "
                 f"{result.get('meta_measured_event')}; floor (every layer recomputed) "
                 f"{_size(result.get('floor_bytes'))}; predicted recompute {result['recompute_micros'] / 1e3:.2f} ms "
                 "per step" + (f" on {result['device']['name']} (its datasheet's peak: a lower bound)"
                               if result.get("device") else ""))
    f = result["fixed"]
    lines.append("fixed, per rank: " + ", ".join(f"{k.replace('_', ' ')} {_size(v)}" for k, v in f.items()
                                                 if isinstance(v, int)))
    lines.append("parameters per top-level module, per rank: " + ", ".join(
        f"{k} {_size(v)}" for k, v in f["per_module_parameters"].items()))
    top = max(peak, 1)
    lines.append(f"{'layer':<20} {'plan':<18} {'kept':>10} {'forward':>10} {'backward':>10} "
                 f"{'saved/recomp/served':>20} {'recompute':>11} {'of peak':>8}")
    for x in result["layers"]:
        plan_text = f"budget {_size(x['budget_bytes'])}" if x["checkpointed"] else "not checkpointed"
        kept = x["kept_bytes"] if x["checkpointed"] else x["off_bytes"]
        ops = x.get("ops") or {}
        counts = "/".join(str(ops.get(k, "-")) for k in ("saved", "recomputed", "served"))
        lines.append(f"{x['path']:<20} {plan_text:<18} {_size(kept):>10} {_size(x['forward_bytes']):>10} "
                     f"{_size(x['backward_bytes']):>10} {counts:>20} {x['recompute_micros'] / 1e3:>8.3f} ms "
                     f"{100.0 * kept / top:>7.1f}%")
    for mode, mm in result.get("modes", {}).items():
        lines.append(f"mode {mode}: {_size(mm['peak_bytes'])} per rank at {mm['event']}")
    if peak > target:
        lines.append(f"over the target by {_size(peak - target)} at {result.get('meta_measured_event')}; the largest "
                     "holders: " + ", ".join(f"{what} {_size(n)}" for what, n in holders(result)))
    lines += [f"note: {n}" for n in result.get("notes", [])]
    return "\n".join(lines)


def run_report(model: torch.nn.Module, prep: Any, cfg: dict) -> Dict[str, Any]:
    """The whole-step report of a real run under a memory target (hpac.hf.prepare's Preparation), in plan()'s form,
    for report_text and plot: its last step measured, its plan, the fixed parts on this rank."""
    report = prep.target.report()
    last = report["history"][-1] if report["history"] else {}
    stats = prep.take_layer_stats()
    tr = cfg["train"]
    run = type("Run", (), {})()
    run.model, run.world, run.batch, run.seq = model, 1, tr["micro_batch"], tr["seq_len"]
    run.dtype = next(model.parameters()).dtype
    import torch.distributed as dist
    world = dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1
    return {"format": FORMAT, "made_by": {"hpac": _version(), "torch": torch.__version__},
            "measured_on": str(next(model.parameters()).device), "model": _model_identity(model),
            "shapes": {"micro_batch": run.batch, "seq_len": run.seq}, "dtype": str(run.dtype).replace("torch.", ""),
            "world_size": world, "memory_target_bytes": report["target_bytes"],
            "predicted_bytes": report["predicted_bytes"], "predicted_event": report["predicted_event"],
            "meta_measured_bytes": last.get("measured_bytes"), "meta_measured_event": last.get("measured_event"),
            "recompute_micros": sum(x["recompute_micros"] for x in report["layers"] if x["checkpointed"]),
            "floor_bytes": None, "events": report["events"], "fixed": _fixed_parts(run),
            "layers": [dict(x, path=p.path, ops={k: st.get(k, 0) for k in ("saved", "recomputed", "served")})
                       for x, p, st in zip(report["layers"], prep.layers, stats)], "notes": []}


def plot(result: Dict[str, Any], path: Union[str, os.PathLike]) -> None:
    """One picture of the step (PNG or SVG by the path's suffix, matplotlib), per rank. Left: the predicted peak
    as a stack of what holds it, in the order the step adds it (the fixed parts, each layer's kept bytes, then the
    rest of the peak's event: transients, the layer running, the logits), the measured peak as a black line and
    the target as a red one. Right: per layer, what it keeps and its predicted recompute time."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    gib = float(1 << 30)
    fig, (ax, bx) = plt.subplots(1, 2, figsize=(12, 4.5), gridspec_kw={"width_ratios": [1.3, 2]})
    fixed = [(k, v) for k, v in result["fixed"].items() if isinstance(v, int) and v > 0 and k != "logits"]
    greys = ["#4d4d4d", "#7a7a7a", "#a6a6a6", "#c8c8c8"]
    bottom = 0.0
    for i, (what, n) in enumerate(fixed):
        ax.bar(0, n / gib, bottom=bottom, color=greys[i % len(greys)], label=what.replace("_", " "))
        bottom += n / gib
    layers = result["layers"]
    kept = [(x["kept_bytes"] if x["checkpointed"] else x["off_bytes"]) / gib for x in layers]
    for x, k in zip(layers, kept):
        ax.bar(0, k, bottom=bottom, color="#1f77b4" if x["checkpointed"] else "#9ecae1", edgecolor="white",
               linewidth=0.3)
        bottom += k
    rest = max(0.0, result["predicted_bytes"] / gib - bottom)
    ax.bar(0, rest, bottom=bottom, color="#fdae6b", label=f"the rest of the peak ({result['predicted_event']})")
    ax.bar(0, 0, color="#1f77b4", label="kept, checkpointed layers")
    ax.bar(0, 0, color="#9ecae1", label="kept, layers not checkpointed")
    if result.get("meta_measured_bytes"):
        ax.hlines(result["meta_measured_bytes"] / gib, -0.45, 0.45, color="black", label="measured peak")
    ax.axhline(result["memory_target_bytes"] / gib, color="#d62728", linestyle="--", label="target")
    ax.set_xticks([0], ["predicted peak"])
    ax.set_xlim(-0.5, 2.3)  # the legend stands beside the bar
    ax.set_ylabel("GiB per rank")
    ax.legend(fontsize=7, loc="center right")
    idx = list(range(len(layers)))
    bx.bar(idx, kept, color=["#1f77b4" if x["checkpointed"] else "#9ecae1" for x in layers])
    bx.set_xlabel("layer")
    bx.set_ylabel("kept until its backward, GiB")
    cx = bx.twinx()
    cx.plot(idx, [x["recompute_micros"] / 1e3 for x in layers], "o-", color="#ff7f0e", markersize=3)
    cx.set_ylabel("predicted recompute, ms per step", color="#ff7f0e")
    bx.xaxis.get_major_locator().set_params(integer=True)
    m = result["model"]
    where = (f"{result['device']['name']} x {result['world_size']} (planned on meta)" if result.get("device")
             else result.get("measured_on", ""))
    fig.suptitle(f"{m['class']}, {m.get('num_hidden_layers')} layers, micro-batch {result['shapes']['micro_batch']} "
                 f"x {result['shapes']['seq_len']}, {result['dtype']}, {where}; target "
                 f"{_size(result['memory_target_bytes'])}", fontsize=10)
    fig.tight_layout()
    fig.savefig(os.fspath(path), metadata={"Date": None} if str(path).endswith(".svg") else None)
    plt.close(fig)


# --- applying a plan (activation_checkpoint.plan; hpac.hf.prepare) ---------------------------------------------------
def load_plan(path: Union[str, os.PathLike]) -> Dict[str, Any]:
    """A plan file made by plan(out=...); PlanError naming the file when it is not one."""
    path = os.fspath(path)
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except FileNotFoundError:
        raise PlanError(f"hpac: activation_checkpoint.plan {path!r}: no such file; allowed: a plan written by "
                        "`python -m hpac plan CONFIG --out FILE`") from None
    except json.JSONDecodeError as e:
        raise PlanError(f"hpac: activation_checkpoint.plan {path!r} is not JSON ({e}); allowed: a plan written by "
                        "`python -m hpac plan CONFIG --out FILE`") from None
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        found = data.get("format") if isinstance(data, dict) else type(data).__name__
        raise PlanError(f"hpac: activation_checkpoint.plan {path!r} has format {found!r}; allowed: {FORMAT!r} "
                        "(plans are not converted: make it again with `python -m hpac plan`)")
    return data


def check_plan(plan_data: Dict[str, Any], path: str, model: torch.nn.Module, cfg: dict,
               warn: Callable[[str], None]) -> None:
    """Refuses a plan made for another model, shapes, dtype or world size, naming the first difference; a plan made
    with another torch is warned about (its op sequence may differ; the region checks that as it replays)."""
    def refuse(what, planned, here):
        raise PlanError(f"hpac: activation_checkpoint.plan {path!r} was made for {what} {planned!r}, this run has "
                        f"{here!r}; allowed: a plan made for this run (`python -m hpac plan` on its config)")
    mine = _model_identity(model)
    for key, planned in plan_data["model"].items():
        if mine.get(key) != planned:
            refuse(f"model {key}", planned, mine.get(key))
    tr = cfg["train"]
    for key in ("micro_batch", "seq_len"):
        if plan_data["shapes"][key] != tr[key]:
            refuse(f"train.{key}", plan_data["shapes"][key], tr[key])
    dtypes = {str(p.dtype).replace("torch.", "") for p in model.parameters()}
    if dtypes != {plan_data["dtype"]}:
        refuse("dtype", plan_data["dtype"], ", ".join(sorted(dtypes)))
    import torch.distributed as dist
    world = dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1
    if world != plan_data["world_size"]:
        refuse("world size", plan_data["world_size"], world)
    if plan_data["made_by"]["torch"] != torch.__version__:
        warn(f"activation_checkpoint.plan {path!r} was made with torch {plan_data['made_by']['torch']}, this is "
             f"torch {torch.__version__}: a layer whose ops differ is reported when it replays")


def shape_guard(model: torch.nn.Module, plan_data: Dict[str, Any], path: str):
    """A forward pre-hook refusing a batch of other shapes than the plan's (input_ids or inputs_embeds)."""
    want = (plan_data["shapes"]["micro_batch"], plan_data["shapes"]["seq_len"])

    def check(module, args, kwargs):
        x = kwargs.get("input_ids", kwargs.get("inputs_embeds", args[0] if args else None))
        if isinstance(x, torch.Tensor) and tuple(x.shape[:2]) != want:
            raise PlanError(f"hpac: activation_checkpoint.plan {path!r} was made for batches of micro_batch x seq_len "
                            f"{want}, this call has {tuple(x.shape[:2])}; allowed: the plan's shapes (make a plan "
                            "for these with `python -m hpac plan`)")
    return model.register_forward_pre_hook(check, with_kwargs=True)
