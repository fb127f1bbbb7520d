"""The experiment at the target's shapes, as bench.scale.target_shapes runs it and bench.scale.gpu_check repeats it on a
device: transformers' Qwen3MoeForCausalLM at Qwen3-30B-A3B's layer shapes (the preset qwen3_moe_30b_a3b with fewer
experts and a reduced vocabulary), every mode on one model and one AdamW, one interleaved run per layer count, then
the peak per mode derived at the target's layer count. bench/scale/target_shapes.py's docstring says what is
measured and how; bench.common.target_shapes_table renders what run() returns.
"""
import gc
import os
import statistics
import time
import warnings

import torch

import hpac
import hpac.harness.compare as hc
import hpac.harness.models as hm
from hpac.harness.stats import Memory

from bench.common import environment, write_json

# Sequences per step: the least at which selective and both budgets keep more per layer than a layer's gradients take
# (seq 1024, 8 experts: at batch 2 budget 0.25 keeps less; see the docstring). Callers that build the options
# themselves (bench/scale/gpu_check.py) and set no batch get this too.
DEFAULT_BATCH = 3
MODES = ("off", "full", "selective", "budget:0.25", "budget:0.5", "compile:0.5")
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}
# The seed's table (../shared/DESIGN.md's reference design): Qwen3-30B-A3B, seq 1024, 48 layers, accelerators, bf16.
SEED = {"off": {"peak_gb": 29.60, "step_s": 6.29}, "full": {"peak_gb": 26.91, "step_s": 7.21},
        "selective": {"peak_gb": 25.74, "step_s": 7.91}}
# --dry-run: the same code on tiny shapes (the preset's dimensions replaced).
TINY = dict(hidden_size=64, num_attention_heads=4, num_key_value_heads=2, head_dim=16, moe_intermediate_size=32,
            num_experts_per_tok=2)


def model_spec(layers, experts, vocab, tiny=False):
    """The preset's `model` section (hpac.hf.parse_config, the C++ parser) with the counts replaced."""
    import hpac.hf as hf
    extra = "".join(f", {k}: {v}" for k, v in TINY.items()) if tiny else ""
    text = (f"model: {{preset: qwen3_moe_30b_a3b, num_layers: {layers}, num_experts: {experts}, "
            f"vocab_size: {vocab}{extra}}}\n")
    return hf.parse_config(text, "target_shapes.yaml")["model"]


def build(spec, seq, dtype, device):
    import transformers
    transformers.logging.set_verbosity_error()
    return hm.qwen3_moe_model(spec, 1234, dtype=dtype, device=device, max_position_embeddings=max(4096, seq))


class Modes:
    """Puts one model's decoder layers into a mode: hpac wrappers, or the compiled layers, or neither."""

    def __init__(self, model, modes, compile_backend):
        self.model, self.modes, self.backend = model, list(modes), compile_backend
        self.layers = list(model.model.layers)
        self.budgets = {m: [hpac.budget(float(m.partition(":")[2])) for _ in self.layers]
                        for m in self.modes if m.startswith("budget:")}
        self.compiled = {m: [torch.compile(layer, backend=compile_backend) for layer in self.layers]
                         for m in self.modes if m.startswith("compile:")}

    def apply(self, mode):
        layers = self.model.model.layers
        for i, layer in enumerate(self.layers):
            hpac.unwrap_checkpoint(layer)
            layers[i] = self.compiled[mode][i] if mode in self.compiled else layer
            if mode in ("full", "selective"):
                hpac.checkpoint_wrapper(layer, policy=mode)
            elif mode in self.budgets:
                hpac.checkpoint_wrapper(layer, policy=self.budgets[mode][i])

    def context(self, mode):
        """torch.compile's budget is read when a graph is compiled: set it around every compiled step."""
        import contextlib
        if mode not in self.compiled:
            return contextlib.nullcontext()
        import torch._functorch.config as functorch_config
        return functorch_config.patch(activation_memory_budget=float(mode.partition(":")[2]))


def one_step(model, opt, ids, memory, ctx):
    """(seconds, peak bytes, peak bytes above the start, kept after forward, bytes at the start, loss, peak above the
    start before AdamW's step) of forward + backward + AdamW step."""
    opt.zero_grad(set_to_none=True)
    gc.collect()
    gc.disable()
    try:
        memory.sync()
        start = memory.current()
        memory.reset_peak()
        t0 = time.perf_counter()
        with ctx:
            loss = model(input_ids=ids, labels=ids, use_cache=False).loss
        kept = memory.current() - start
        loss.backward()
        memory.sync()
        peak_fb = memory.peak()
        opt.step()
        memory.sync()
        seconds = time.perf_counter() - t0
        peak = memory.peak()
    finally:
        gc.enable()
    return seconds, peak, peak - start, kept, start, loss.detach().float().item(), peak_fb - start


def batch_of(a):
    return getattr(a, "batch", DEFAULT_BATCH)


def measure_layers(layers, a, memory, log):
    """One interleaved run at one layer count: {mode: row}."""
    spec = model_spec(layers, a.experts, a.vocab, tiny=a.tiny)
    model = build(spec, a.seq, DTYPES[a.dtype], a.device)
    params = sum(p.numel() for p in model.parameters())
    opt = torch.optim.AdamW(model.parameters(), lr=1e-5, weight_decay=0.0)
    modes = Modes(model, a.modes, a.compile_backend)
    ids = hm.token_batch(spec["vocab_size"], batch_of(a), a.seq, 1234, 0).to(a.device)
    keys = ("s", "peak", "above", "kept", "start", "loss", "above_fb")
    rec = {m: {k: [] for k in keys} for m in a.modes}
    warm = {}
    for r in range(a.steps + 1):
        line = []
        for mode in hc.rotated(a.modes, r):
            modes.apply(mode)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                values = one_step(model, opt, ids, memory, modes.context(mode))
            s, peak = values[:2]
            line.append(f"{mode} {s:.2f}s {peak / 2**20:.0f}MiB")
            if r == 0:
                warm[mode] = s
                continue
            for k, v in zip(keys, values):
                rec[mode][k].append(v)
        log(f"{layers} layer(s) round {r}/{a.steps}{' (warm-up)' if r == 0 else ''}: " + ", ".join(line))
    modes.apply("off")
    off = rec["off"]["s"]
    rows = {}
    for mode, x in rec.items():
        row = {"s_median": statistics.median(x["s"]), "s_all": x["s"],
               "time_vs_off_paired": statistics.median(t / o for t, o in zip(x["s"], off)),
               "peak_bytes": max(x["peak"]), "peak_above_start_bytes": max(x["above"]),
               "peak_above_start_before_optimizer_bytes": max(x["above_fb"]), "peak_all": x["peak"],
               "peak_above_start_before_optimizer_all": x["above_fb"],
               "kept_bytes": max(x["kept"]), "start_bytes": statistics.median(x["start"]),
               "losses": x["loss"], "warmup_s": warm[mode]}
        if mode in modes.budgets:
            row["plans"] = [{k: st[k] for k in ("stage", "kept_bytes", "off_bytes", "saved_ops", "skipped_ops",
                                                "planned_ops")} for st in (b.status() for b in modes.budgets[mode])]
        rows[mode] = row
    del modes, opt, model
    gc.collect()
    if memory.cuda:
        torch.cuda.empty_cache()
    return {"layers": layers, "parameters": params, "rows": rows}


def fit(points):
    """(a, b) of the least-squares line y = a + b*x; one point: b = 0."""
    xs, ys = [p[0] for p in points], [p[1] for p in points]
    if len(set(xs)) < 2:
        return ys[0], 0.0
    mx, my = statistics.mean(xs), statistics.mean(ys)
    b = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sum((x - mx) ** 2 for x in xs)
    return my - b * mx, b


def derive(runs, modes, target_layers):
    """Per mode: peak(L) = a + b*L over the runs, the value at target_layers, b split into at-rest and at-peak
    terms, and the leave-the-largest-out check."""
    out = {}
    for mode in modes:
        pts = {k: [(r["layers"], r["rows"][mode][k]) for r in runs]
               for k in ("peak_bytes", "start_bytes", "peak_above_start_bytes", "kept_bytes", "s_median")}
        a, b = fit(pts["peak_bytes"])
        entry = {"a_bytes": a, "b_bytes_per_layer": b, "peak_bytes_derived": a + b * target_layers,
                 "b_at_rest_bytes_per_layer": fit(pts["start_bytes"])[1],
                 "b_above_start_bytes_per_layer": fit(pts["peak_above_start_bytes"])[1],
                 "b_kept_bytes_per_layer": fit(pts["kept_bytes"])[1],
                 "fit_residual_max_rel": max(abs(a + b * x - y) / y for x, y in pts["peak_bytes"])}
        ta, tb = fit(pts["s_median"])
        entry.update({"a_s": ta, "b_s_per_layer": tb, "s_derived": ta + tb * target_layers})
        if len(runs) >= 3:  # leave the largest layer count out: fit on the others, predict it
            largest = max(pts["peak_bytes"])
            la, lb = fit([p for p in pts["peak_bytes"] if p != largest])
            entry["loo"] = {"layers": largest[0], "measured_bytes": largest[1], "predicted_bytes": la + lb * largest[0],
                            "error_rel": (la + lb * largest[0]) / largest[1] - 1}
        out[mode] = entry
    return out


def run(a, layer_counts, log=None):
    """Every layer count's interleaved run, then the derivation; `a` holds main()'s options."""
    started = time.perf_counter()
    log = log or (lambda msg: print(f"[target_shapes {time.perf_counter() - started:.0f}s] {msg}", flush=True))
    memory = Memory(a.device)
    import transformers  # noqa: F401 (the header names its version)
    data = {**environment("target_shapes"), "device": a.device,
            "device_name": torch.cuda.get_device_name(0) if memory.cuda else f"{os.cpu_count()} CPUs",
            "dtype": a.dtype, "seq": a.seq, "batch": batch_of(a),
            "experts": a.experts, "vocab": a.vocab, "steps": a.steps, "modes": a.modes, "dry_run": a.dry_run,
            "compile_backend": a.compile_backend, "target_layers": a.target_layers, "seed": SEED,
            "optimizer": "AdamW (lr 1e-5, weight_decay 0), zero_grad(set_to_none=True)", "runs": []}
    data["model"] = model_spec(1, a.experts, a.vocab, tiny=a.tiny)
    for layers in layer_counts:
        data["runs"].append(measure_layers(layers, a, memory, log))
        data["derived"] = derive(data["runs"], a.modes, a.target_layers)
        data["wall_s"] = time.perf_counter() - started
        data["load_average_at_end"] = os.getloadavg()[0]
        if getattr(a, "out", None):
            write_json(a.out, data)  # after every layer count: a run stopped early leaves what it measured
    return data
