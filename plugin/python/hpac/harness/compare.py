"""Level0 comparison on real transformers models: the same model trained under off, full and selective from one seed,
step by step, with losses and gradients compared against the off run (used by tools/demo.sh, the Level0 tests and
bench/scale/hf_qwen3_30b_layer.py).

    cmp = train_compare(build, cfg_dict, make_batch, steps=5)   # build(): a fresh model (same seed each call)
    print(format_table(cmp))
"""
import copy
import statistics
import time
from dataclasses import InitVar, dataclass, field
from typing import List, Optional

import torch

import hpac
import hpac.hf as hf
from . import stats

MODES = ("off", "full", "selective")


def max_abs_diff(a, b):
    """NaN or Inf anywhere is never equal (inf)."""
    if not (torch.isfinite(a).all() and torch.isfinite(b).all()):
        return float("inf")
    return (a.double() - b.double()).abs().max().item() if a.numel() else 0.0


@dataclass(eq=False)
class ModeRun:
    """One mode's model, preparation and AdamW optimizer (learning rate `lr`), and what each step measured."""
    mode: str
    model: torch.nn.Module = field(repr=False)
    prep: hf.Preparation = field(repr=False)
    lr: InitVar[float]
    opt: torch.optim.Optimizer = field(init=False, repr=False)
    # per step
    losses: List[torch.Tensor] = field(default_factory=list, init=False)
    peaks: List[Optional[int]] = field(default_factory=list, init=False)
    kept: List[Optional[int]] = field(default_factory=list, init=False)
    times: List[float] = field(default_factory=list, init=False)
    layer_stats: List[list] = field(default_factory=list, init=False)
    # over the steps, against off
    max_dloss: float = field(default=0.0, init=False)
    max_dgrad: float = field(default=0.0, init=False)

    def __post_init__(self, lr):
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=lr, weight_decay=0.0)

    @property
    def wrapped(self):
        return f"{self.prep.layers_wrapped}L+{self.prep.submodules_wrapped}S"


def _step(run, input_ids, tracked):
    run.opt.zero_grad(set_to_none=False)
    if tracked:
        start = hpac.cpu_tensor_memory_stats()["current_bytes"]
        hpac.reset_cpu_tensor_peak()
    t0 = time.perf_counter()
    loss = run.model(input_ids=input_ids, labels=input_ids).loss
    run.kept.append(hpac.cpu_tensor_memory_stats()["current_bytes"] - start if tracked else None)
    loss.backward()
    elapsed = time.perf_counter() - t0
    run.peaks.append(hpac.cpu_tensor_memory_stats()["peak_bytes"] - start if tracked else None)
    run.times.append(elapsed)
    run.losses.append(loss.detach())
    run.layer_stats.append(run.prep.take_layer_stats())
    grads = [p.grad.detach().clone() for p in run.model.parameters()]
    run.opt.step()
    return grads


def rotated(modes, step):
    """The modes in the order step `step` runs them: rotated by one every step, so that no mode always runs first
    (after another mode's garbage, or on a cold cache)."""
    modes = list(modes)
    k = step % len(modes)
    return modes[k:] + modes[:k]


def mode_config(config, mode):
    """`config` with activation_checkpoint.mode replaced by `mode` (and no per-layer plan). A mode "budget:<f>" is
    mode budget with memory_budget <f> (a fraction in [0, 1]; hpac.budget checks it)."""
    cfg = copy.deepcopy(config)
    ac = cfg["activation_checkpoint"]
    name, _, fraction = mode.partition(":")
    ac["mode"], ac["layers"] = name, []
    if name == "budget" and fraction:
        ac["memory_budget"] = {"fraction": float(fraction), "bytes": None, "text": fraction, "where": "(mode)"}
    return cfg


def train_compare(build, config, make_batch, steps, modes=MODES, lr=1e-3, track_memory=True, progress=None,
                  registry=None, log=None, compile_backend="inductor"):
    """Trains build()'s model under each mode (the config's activation_checkpoint.mode replaced, see mode_config),
    interleaved step
    by step with the order rotated each step. Gradients are allocated before the first step so
    every step and mode starts from the same resident set. Returns {mode: ModeRun}."""
    if track_memory:
        hpac.track_memory()
    registry = registry if registry is not None else hf.load_registry()
    runs = {}
    for mode in modes:
        model = build()
        model.train()
        prep = hf.prepare(model, mode_config(config, mode), registry, log=log, compile_backend=compile_backend)
        for p in model.parameters():
            p.grad = torch.zeros_like(p)
        runs[mode] = ModeRun(mode, model, prep, lr)
    for step in range(steps):
        input_ids = make_batch(step)
        grads = {}
        for mode in rotated(modes, step):
            grads[mode] = _step(runs[mode], input_ids, track_memory)
        if "off" in runs:
            for mode, run in runs.items():
                run.max_dloss = max(run.max_dloss, max_abs_diff(run.losses[-1], runs["off"].losses[-1]))
                for g, g0 in zip(grads[mode], grads["off"]):
                    run.max_dgrad = max(run.max_dgrad, max_abs_diff(g, g0))
        if progress:
            progress(step, runs)
    return runs


def route_words(prep, mode):
    """The route as hpac-train's table words it (tools/trainer/trainer.cpp, routeOf): '-', 'full: native',
    'selective: whole layers', 'budget->submodules (KV sharing)', ..."""
    if not prep.touched:
        return "-"
    name = mode.partition(":")[0]
    if name in ("selective", "budget"):
        return f"{name}->submodules (KV sharing)" if prep.kv_sharing else f"{name}: whole layers"
    return f"full: {prep.full_route}" if prep.full_route else "-"


def budget_note(run, memory_budget_text):
    """What a budget run's layer plans keep, summed over its layers: the sentence hpac-train's table ends with
    (tools/trainer/trainer.cpp, budgetNote), from each layer's hpac.Budget.status()."""
    kept = off = saved = skipped = ops = layers = 0
    saved_us = total_us = 0.0
    for layer in run.prep.layers:
        if layer.budget is None:
            continue
        st = layer.budget.status()
        if st.get("stage") != "planned":
            continue
        layers += 1
        kept += st["kept_bytes"]
        off += max(st["off_bytes"], 0)
        saved += st["saved_ops"]
        skipped += st["skipped_ops"]
        ops += st["planned_ops"]
        saved_us += st["saved_micros"] + st["skipped_micros"]
        total_us += st["total_micros"]
    if not layers:
        return "budget: no layer planned (every step profiled or fell back)"
    return (f"budget (memory_budget {memory_budget_text} per layer): {layers} layer plans keep {kept / 2**20:.2f} MiB "
            f"of the {off / 2**20:.2f} MiB off keeps ({100 * kept / off if off else 0:.0f}%); {saved} of {ops} ops "
            f"saved, {skipped} skipped; {100 * saved_us / total_us if total_us else 0:.0f}% of the recompute's "
            "profiled kernel time avoided")


def summary(runs, memory_budget_text=None):
    """One row per mode: the columns of the main job's table (Note [One table for the main job],
    tools/trainer/trainer.cpp): peak_vs_off and time_vs_off are signed changes against off (negative: less);
    step_time_s is the median over steps. A budget row's `note` says what its plans keep."""
    off = runs.get("off")
    rows = []
    for mode, run in runs.items():
        peak = max(run.peaks) if run.peaks and run.peaks[0] is not None else None
        t = statistics.median(run.times)
        last = run.layer_stats[-1] if run.layer_stats else []
        off_peak = max(off.peaks) if off is not None and off.peaks and off.peaks[0] is not None else None
        rows.append({
            "mode": mode, "peak_bytes": peak, "kept_after_forward_bytes": run.kept[-1],
            "peak_vs_off": (peak / off_peak - 1) if off_peak and peak is not None else None,
            "step_time_s": t, "time_vs_off": (t / statistics.median(off.times) - 1) if off is not None else None,
            "max_dloss": run.max_dloss, "max_dgrad": run.max_dgrad, "route": route_words(run.prep, mode),
            "wrapped": run.wrapped,
            **stats.totals(last, ("recomputed", "served")),
            "note": budget_note(run, memory_budget_text or mode.partition(":")[2] or "?")
            if mode.startswith("budget") else "",
        })
    return rows


def format_table(rows):
    """The main job's table, as hpac-train prints it (Note [One table for the main job], tools/trainer/trainer.cpp)."""
    lines = [f"{'mode':<10} {'peak_mem':>11} {'peak_vs_off':>11} {'step_time':>11} {'time_vs_off':>11} "
             f"{'max|dloss|':>10} {'max|dgrad|':>10}  {'route':<34} {'wrapped':>7} {'recomputed/step':>15} "
             f"{'served/step':>11}"]
    for r in rows:
        is_off = r["mode"] == "off"
        peak = f"{r['peak_bytes'] / 2**20:.2f} MiB" if r["peak_bytes"] is not None else "n/a"
        peak_change = "-" if is_off or r["peak_vs_off"] is None else f"{100 * r['peak_vs_off']:+.1f}%"
        time_change = "-" if is_off or r["time_vs_off"] is None else f"{100 * r['time_vs_off']:+.1f}%"
        lines.append(f"{r['mode']:<10} {peak:>11} {peak_change:>11} {1000 * r['step_time_s']:>8.1f} ms "
                     f"{time_change:>11} {r['max_dloss']:>10.3g} {r['max_dgrad']:>10.3g}  {r['route']:<34} "
                     f"{r['wrapped']:>7} {r['recomputed']:>15} {r['served']:>11}")
    lines += [r["note"] for r in rows if r.get("note")]
    return "\n".join(lines)
