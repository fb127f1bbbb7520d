"""The whole step's record (policy/step_record.h, Note [The step record's format]): the plan file that
`python -m hpac plan` writes and `activation_checkpoint.plan` applies (hpac.hf.prepare reads it here, through the C++
reader), the report of a real run under a memory target (Preparation.step_report), and their text and picture. One
record, one format (FORMAT): MemoryTarget.report() (C++) and the context this module adds (step_record); hpac.plan
makes it on the meta device and re-exports what reads it. This module imports neither hpac.hf nor hpac.plan.
"""
import json
import os
from typing import Any, Callable, Dict, List, Optional, Union

import torch

from ._loader import version
from ._target import format_bytes

FORMAT = "hpac-step-plan 2"  # policy/step_record.h, kStepRecordFormat
_MODEL_KEYS = ("num_hidden_layers", "hidden_size", "num_attention_heads", "num_key_value_heads", "head_dim",
               "intermediate_size", "moe_intermediate_size", "num_experts", "num_experts_per_tok", "vocab_size",
               "norm_topk_prob", "rms_norm_eps")


class PlanError(ValueError):
    """A plan that cannot be made (a config it does not model, a target below the floor) or applied (made for
    another model, shapes, dtype or world size); the message names the difference and what is allowed."""


def _nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


def format_size(n: Optional[int]) -> str:
    return "-" if n is None else format_bytes(n)


def model_identity(model: torch.nn.Module) -> Dict[str, Any]:
    """What a plan is made for: the model's class and the config values that set its shapes."""
    cfg = model.config
    out = {"class": type(model).__name__}
    out.update({k: getattr(cfg, k) for k in _MODEL_KEYS if hasattr(cfg, k)})
    return out


def fixed_parts(model: torch.nn.Module, world: int, batch: int, seq: int, dtype: torch.dtype) -> Dict[str, int]:
    """What one rank holds besides activations, per top-level module and kind (Note [One rank of a sharded step],
    hpac/plan.py): parameters, gradients and AdamW's two moments, sharded over the world; the logits of one
    micro-batch."""
    per_module: Dict[str, int] = {}
    for name, p in model.named_parameters():
        top = ".".join(name.split(".")[:2]) if name.startswith("model.") else name.split(".")[0]
        per_module[top] = per_module.get(top, 0) + _nbytes(p)
    layer = max((sum(_nbytes(p) for p in m.parameters()) for m in model.model.layers), default=0)
    params = sum(per_module.values())
    return {"parameters": params // world, "gradients": params // world, "optimizer_state": 2 * params // world,
            "all_gathered_layers": 2 * layer if world > 1 else 0,
            "logits": batch * seq * model.config.vocab_size * torch.finfo(dtype).bits // 8,
            "per_module_parameters": {k: v // world for k, v in per_module.items()}}


def step_record(model: torch.nn.Module, target: Any, layers: List[Any], stats: List[Dict[str, int]], *, world: int,
                batch: int, seq: int, dtype: torch.dtype, **more: Any) -> Dict[str, Any]:
    """The record (FORMAT) of a step under a memory target: what `target` (hpac.MemoryTarget) reports, each layer
    with its op counts from `stats` (take_layer_stats, in the order of `layers`, hf's PreparedLayers), and the context:
    the model's identity, shapes, dtype, world size and fixed parts; `more` adds or overrides context keys (a plan's
    device, config, floor_bytes, messages, notes)."""
    out = target.report()
    out["layers"] = [dict(x, ops={k: st.get(k, 0) for k in ("saved", "recomputed", "served")})
                     for x, p, st in zip(out["layers"], layers, stats)]
    out.update({"made_by": {"hpac": version(), "torch": torch.__version__}, "config": None,
                "model": model_identity(model), "shapes": {"micro_batch": batch, "seq_len": seq},
                "dtype": str(dtype).replace("torch.", ""), "world_size": world, "floor_bytes": None,
                "fixed": fixed_parts(model, world, batch, seq, dtype), "messages": [], "notes": []})
    out.update(more)
    return out


def run_report(model: torch.nn.Module, prep: Any, cfg: dict) -> Dict[str, Any]:
    """The whole-step record of a real run under a memory target (hpac.hf.prepare's Preparation), for report_text and
    plot: its last step measured, its plan, the fixed parts on this rank. Takes the layers' stats."""
    import torch.distributed as dist
    world = dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1
    tr = cfg["train"]
    return step_record(model, prep.target, prep.layers, prep.take_layer_stats(), world=world,
                       batch=tr["micro_batch"], seq=tr["seq_len"], dtype=next(model.parameters()).dtype,
                       measured_on=str(next(model.parameters()).device))


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
    peak, target = result.get("measured_bytes") or result["predicted_bytes"], result["target_bytes"]
    lines.append(f"target {format_size(target)}: predicted {format_size(result['predicted_bytes'])} at "
                 f"{result['predicted_event']}; measured {format_size(result.get('measured_bytes'))} at "
                 f"{result.get('measured_event')}; floor (every layer recomputed) "
                 f"{format_size(result.get('floor_bytes'))}; predicted recompute "
                 f"{result['recompute_micros'] / 1e3:.2f} ms "
                 "per step" + (f" on {result['device']['name']} (its datasheet's peak: a lower bound)"
                               if result.get("device") else ""))
    f = result["fixed"]
    lines.append("fixed, per rank: " + ", ".join(f"{k.replace('_', ' ')} {format_size(v)}" for k, v in f.items()
                                                 if isinstance(v, int)))
    lines.append("parameters per top-level module, per rank: " + ", ".join(
        f"{k} {format_size(v)}" for k, v in f["per_module_parameters"].items()))
    top = max(peak, 1)
    lines.append(f"{'layer':<20} {'plan':<18} {'kept':>10} {'forward':>10} {'backward':>10} "
                 f"{'saved/recomp/served':>20} {'recompute':>11} {'of peak':>8}")
    for x in result["layers"]:
        plan_text = f"budget {format_size(x['budget_bytes'])}" if x["checkpointed"] else "not checkpointed"
        kept = x["kept_bytes"] if x["checkpointed"] else x["off_bytes"]
        ops = x.get("ops") or {}
        counts = "/".join(str(ops.get(k, "-")) for k in ("saved", "recomputed", "served"))
        lines.append(f"{x['path']:<20} {plan_text:<18} {format_size(kept):>10} {format_size(x['forward_bytes']):>10} "
                     f"{format_size(x['backward_bytes']):>10} {counts:>20} {x['recompute_micros'] / 1e3:>8.3f} ms "
                     f"{100.0 * kept / top:>7.1f}%")
    for mode, mm in result.get("modes", {}).items():
        lines.append(f"mode {mode}: {format_size(mm['peak_bytes'])} per rank at {mm['event']}")
    if peak > target:
        lines.append(f"over the target by {format_size(peak - target)} at {result.get('measured_event')}; the "
                     "largest "
                     "holders: " + ", ".join(f"{what} {format_size(n)}" for what, n in holders(result)))
    lines += [f"note: {n}" for n in result.get("notes", [])]
    return "\n".join(lines)


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
    if result.get("measured_bytes"):
        ax.hlines(result["measured_bytes"] / gib, -0.45, 0.45, color="black", label="measured peak")
    ax.axhline(result["target_bytes"] / gib, color="#d62728", linestyle="--", label="target")
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
                 f"{format_size(result['target_bytes'])}", fontsize=10)
    fig.tight_layout()
    fig.savefig(os.fspath(path), metadata={"Date": None} if str(path).endswith(".svg") else None)
    plt.close(fig)



# --- applying a plan (activation_checkpoint.plan; hpac.hf.prepare) -------------------------------------------
def load(path: Union[str, os.PathLike]) -> Dict[str, Any]:
    """A plan file made by hpac.plan.plan(out=...), read by the C++ record reader (torch.ops.hpac.read_step_record:
    FORMAT, or a version 1 plan converted); PlanError naming the file, the key and what is allowed when it is not
    one."""
    path = os.fspath(path)
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except FileNotFoundError:
        raise PlanError(f"hpac: activation_checkpoint.plan {path!r}: no such file; allowed: a plan written by "
                        "`python -m hpac plan CONFIG --out FILE`") from None
    try:
        return json.loads(torch.ops.hpac.read_step_record(text, path))
    except RuntimeError as e:
        raise PlanError(str(e).splitlines()[0]) from None


def _context(plan_data: Dict[str, Any], path: str, key: str, kind: type) -> Any:
    value = plan_data.get(key)
    if not isinstance(value, kind):
        raise PlanError(f"hpac: activation_checkpoint.plan {path!r}: {key} is {value!r}; allowed: the {key} a plan "
                        "written by `python -m hpac plan` names (its model, shapes, dtype, world size and torch)")
    return value


def check_plan(plan_data: Dict[str, Any], path: str, model: torch.nn.Module, cfg: dict,
               warn: Callable[[str], None]) -> None:
    """Refuses a plan made for another model, shapes, dtype or world size, naming the first difference; a plan made
    with another torch is warned about (its op sequence may differ; the region checks that as it replays)."""
    def refuse(what, planned, here):
        raise PlanError(f"hpac: activation_checkpoint.plan {path!r} was made for {what} {planned!r}, this run has "
                        f"{here!r}; allowed: a plan made for this run (`python -m hpac plan` on its config)")
    for key, kind in (("model", dict), ("shapes", dict), ("dtype", str), ("world_size", int), ("made_by", dict)):
        _context(plan_data, path, key, kind)
    mine = model_identity(model)
    for key, planned in plan_data["model"].items():
        if mine.get(key) != planned:
            refuse(f"model {key}", planned, mine.get(key))
    tr = cfg["train"]
    for key in ("micro_batch", "seq_len"):
        if plan_data["shapes"].get(key) != tr[key]:
            refuse(f"train.{key}", plan_data["shapes"].get(key), tr[key])
    dtypes = {str(p.dtype).replace("torch.", "") for p in model.parameters()}
    if dtypes != {plan_data["dtype"]}:
        refuse("dtype", plan_data["dtype"], ", ".join(sorted(dtypes)))
    import torch.distributed as dist
    world = dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1
    if world != plan_data["world_size"]:
        refuse("world size", plan_data["world_size"], world)
    if plan_data["made_by"].get("torch") != torch.__version__:
        warn(f"activation_checkpoint.plan {path!r} was made with torch {plan_data['made_by'].get('torch')}, this is "
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
