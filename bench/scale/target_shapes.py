"""The seed's table at the target's shapes, with enough layers that activations set the peak.

transformers' Qwen3MoeForCausalLM built from the project's preset qwen3_moe_30b_a3b (Qwen3-30B-A3B's layer shapes:
hidden 2048, 32 query / 4 KV heads of head_dim 128, top-8 routing with norm_topk_prob, expert width 768, rms eps
1e-6, rope_theta 1e6), with FEWER experts per layer (--experts, default 8 of the real 128) and a reduced vocabulary
(--vocab, default 4096 of the real 151936), random weights, a micro-batch of --batch sequences (default 3), trained
with AdamW. What a layer keeps for backward does not depend on the expert count (every token still goes to 8 experts
of width 768); the weights, their gradients and AdamW's state do, and at 128 experts one layer's fused expert
gradients, not activations, set the peak (docs/results.md, "Real Qwen3-30B-A3B layer shapes").
With 8 experts a mode's peak is the larger of two: what every layer keeps (it grows with the tokens, batch x seq) as
backward starts, or every layer's weight gradients (they do not grow with the tokens) as it ends. At batch 1, seq 1024,
fp32 a layer's gradients (0.21 GiB) outweigh what full, selective and both budgets keep per layer, so those four share
one peak; from batch 3 on what selective and the budgets keep outweighs them, and the modes' peaks part.

Modes, all on one model and one AdamW (the layers re-wrapped every step; the weights move every step, as training):
  off, full, selective     no checkpoint; hpac full; hpac's fixed selective policy (hpac.checkpoint_wrapper per layer)
  budget:<f>               hpac.budget(f) per layer, kept across steps (profiled on the warm-up round)
  compile:<f>              each decoder layer compiled (torch.compile, --compile-backend) with
                           torch._functorch.config.activation_memory_budget = f (torch.compile's own planner, as
                           bench/peers/compile_compare.py's torch_budget rows; compiled on the warm-up round)
ONE interleaved run per layer count: round 0 warms up (budget profiles, compiles, AdamW's state), then every round
runs every mode once, the order rotated each round; per mode: step time (forward + backward + AdamW step) as the
median and as the median of per-round ratios to off (paired), peak = the highest allocated bytes during the step,
absolute (weights, AdamW state, gradients, activations: what a device must hold), and above the step's start, and
kept = what the forward left for backward. Memory: hpac's tracking CPU allocator (hpac.track_memory,
hpac.cpu_tensor_memory_stats) on CPU, torch.cuda.max_memory_allocated on CUDA.

Then the 48-layer peak per mode: peak(L) = a + b*L, least squares over the measured layer counts, checked by leaving
the largest count out (fit on the others, predict it, the error in %), with b split into what a layer holds at rest
(weights + AdamW state, the slope of the step's starting bytes) and what it adds at the peak (activations and
gradients, the slope of the peak above the start), printed beside the seed's numbers.

    GLIBC_TUNABLES=glibc.malloc.mmap_threshold=33554432:glibc.malloc.trim_threshold=4294967296 \\
      nice .venv/bin/python -m bench.scale.target_shapes --layers 1,2,4 --batch 3 --steps 1
    .venv/bin/python -m bench.scale.target_shapes --dry-run          # tiny shapes, every mode, seconds
    .venv/bin/python -m bench.scale.target_shapes --report bench/results/target_shapes.json
    .venv/bin/python -m bench.scale.target_shapes --plot bench/results/target_shapes.json docs/results_target_shapes.svg
"""
import argparse
import gc
import importlib
import json
import os
import statistics
import sys
import time
import warnings

import torch

import hpac
import hpac.harness.compare as hc
import hpac.harness.models as hm
from hpac.harness.stats import Memory

from bench.common import RESULTS, ROOT, environment, write_json

DEFAULT_OUT = os.path.join(RESULTS, "target_shapes.json")
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


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--layers", default="1,2,4", help="comma-separated layer counts, each its own interleaved run")
    ap.add_argument("--steps", type=int, default=4, help="measured rounds (every mode once each) after one warm-up")
    ap.add_argument("--seq", type=int, default=1024)
    ap.add_argument("--batch", type=int, default=DEFAULT_BATCH, help="sequences per step (the micro-batch)")
    ap.add_argument("--experts", type=int, default=8, help="experts per layer (Qwen3-30B-A3B: 128)")
    ap.add_argument("--vocab", type=int, default=4096, help="vocabulary (Qwen3-30B-A3B: 151936)")
    ap.add_argument("--dtype", default="float32", choices=sorted(DTYPES))
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--modes", default=",".join(MODES), help="comma-separated, off first: off, full, selective, "
                                                             "budget:<f>, compile:<f>")
    ap.add_argument("--compile-backend", default="inductor")
    ap.add_argument("--target-layers", type=int, default=48)
    ap.add_argument("--dry-run", action="store_true", help="tiny shapes (hidden 64), seq 32, 2 rounds, aot_eager: "
                                                           "every mode end to end in seconds")
    ap.add_argument("--out", default=None, help=f"JSON (default {os.path.relpath(DEFAULT_OUT, ROOT)}; "
                                                "--dry-run: none unless given)")
    ap.add_argument("--report", metavar="JSON", help="print the docs/results.md section from a JSON and exit")
    ap.add_argument("--plot", nargs=2, metavar=("JSON", "SVG"), help="only draw the plot of a results file: peak "
                                                                   "against layers, measured and fitted, per mode")
    a = ap.parse_args(argv)
    if a.plot:
        with open(a.plot[0]) as f:
            plot(json.load(f), a.plot[1])
        return 0
    if a.report:
        from bench.common.report import load
        from bench.scale.target_shapes_report import target_shapes_table
        print("\n".join(target_shapes_table(load(*os.path.split(a.report)))))
        return 0
    a.tiny = a.dry_run
    if a.dry_run:
        torch.set_num_threads(1)  # tiny ops: a second thread only waits, and on a busy machine it waits long
        a.seq, a.steps, a.experts, a.vocab, a.compile_backend = min(a.seq, 32), min(a.steps, 2), 4, 128, "aot_eager"
        a.layers = "1,2,3" if a.layers == "1,2,4" else a.layers
    a.modes = [m for m in a.modes.split(",") if m]
    try:
        layer_counts = [int(x) for x in a.layers.split(",")]
        for m in a.modes:
            fam, _, f = m.partition(":")
            assert (m in ("off", "full", "selective") or fam in ("budget", "compile") and 0 <= float(f) <= 1)
    except (ValueError, AssertionError):
        ap.error(f"--layers {a.layers!r} / --modes {','.join(a.modes)!r} not allowed: comma-separated positive "
                 "integers; off first, then full, selective, budget:<f>, compile:<f> with f in [0, 1]")
    if a.modes[0] != "off" or min(layer_counts + [a.steps, a.seq, a.batch, a.experts, a.vocab]) < 1:
        ap.error("--modes must start with off; --layers, --steps, --seq, --batch, --experts, --vocab must be positive")
    importlib.import_module("hpac.hf")
    importlib.import_module("transformers")
    gc.freeze()  # the imports' objects out of the collector's way: every step runs gc.collect()
    a.out = a.out or (None if a.dry_run else DEFAULT_OUT)
    data = run(a, layer_counts)  # writes a.out after every layer count
    from bench.scale.target_shapes_report import target_shapes_table
    print("\n".join(target_shapes_table(data)))
    return 0


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
            write(data, a.out)  # after every layer count: a run stopped early leaves what it measured
    return data


COLORS = {"off": "#444444", "full": "#1f77b4", "selective": "#d62728", "budget:0.25": "#2ca02c",
          "budget:0.5": "#98df8a", "compile:0.5": "#9467bd"}


def plot(data, path):
    """An SVG without a plotting library: peak memory against layer count, per mode the measured points and the
    fitted line out to the target layer count, and the seed's three 48-layer peaks as crosses."""
    gib, n = 2 ** 30, data["target_layers"]
    der = data["derived"]
    top = max([e["peak_bytes_derived"] / gib for e in der.values()] + [v["peak_gb"] for v in data["seed"].values()])
    step = next(k * 10 ** e for e in range(-3, 4) for k in (1, 2, 5) if k * 10 ** e * 5 >= top)  # five ticks
    ymax = step * 5
    x0, y0, w, h = 70, 30, 560, 330
    sx = lambda layers: x0 + layers / n * w  # noqa: E731
    sy = lambda v: y0 + h - v / ymax * h  # noqa: E731
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{x0 + w + 220}" height="{y0 + h + 60}" '
           'font-family="sans-serif">', '<rect width="100%" height="100%" fill="white"/>',
           f'<line x1="{x0}" y1="{y0 + h}" x2="{x0 + w}" y2="{y0 + h}" stroke="black"/>',
           f'<line x1="{x0}" y1="{y0}" x2="{x0}" y2="{y0 + h}" stroke="black"/>',
           f'<text x="{x0 + w / 2}" y="{y0 + h + 40}" text-anchor="middle" font-size="12">decoder layers</text>',
           f'<text x="16" y="{y0 + h / 2}" font-size="12" transform="rotate(-90 16 {y0 + h / 2})" '
           'text-anchor="middle">peak GiB</text>']
    for i in range(6):
        v = step * i
        out.append(f'<text x="{x0 - 6}" y="{sy(v) + 4:.1f}" text-anchor="end" font-size="10">{v:g}</text>')
        out.append(f'<line x1="{x0}" y1="{sy(v):.1f}" x2="{x0 + w}" y2="{sy(v):.1f}" stroke="#ddd"/>')
    for layers in sorted({r["layers"] for r in data["runs"]} | {n // 4, n // 2, 3 * n // 4, n}):
        out.append(f'<text x="{sx(layers):.1f}" y="{y0 + h + 16}" text-anchor="middle" font-size="10">{layers}</text>')
    ly = y0 + 10
    for mode, e in der.items():
        color = COLORS.get(mode, "#888888")
        out.append(f'<line x1="{sx(0):.1f}" y1="{sy(e["a_bytes"] / gib):.1f}" x2="{sx(n):.1f}" '
                   f'y2="{sy(e["peak_bytes_derived"] / gib):.1f}" stroke="{color}" stroke-width="1.5"/>')
        for r in data["runs"]:
            out.append(f'<circle cx="{sx(r["layers"]):.1f}" cy="{sy(r["rows"][mode]["peak_bytes"] / gib):.1f}" '
                       f'r="3" fill="{color}"/>')
        out.append(f'<rect x="{x0 + w + 20}" y="{ly - 4}" width="14" height="4" fill="{color}"/>')
        out.append(f'<text x="{x0 + w + 40}" y="{ly + 1}" font-size="11">{mode}: '
                   f'{e["peak_bytes_derived"] / gib:.1f} GiB at {n}</text>')
        ly += 18
    for mode, v in data["seed"].items():
        c = sx(n), sy(v["peak_gb"])
        color = COLORS.get(mode, "#888888")
        out.append(f'<path d="M{c[0] - 5:.1f},{c[1] - 5:.1f} L{c[0] + 5:.1f},{c[1] + 5:.1f} M{c[0] - 5:.1f},'
                   f'{c[1] + 5:.1f} L{c[0] + 5:.1f},{c[1] - 5:.1f}" stroke="{color}" stroke-width="2"/>')
    out.append(f'<text x="{x0 + w + 20}" y="{ly + 8}" font-size="11">x: the seed\'s {n}-layer peaks '
               '(G as quoted)</text>')
    out.append(f'<text x="{x0 + w + 20}" y="{ly + 24}" font-size="10">(bf16, accelerators, parallel)</text>')
    out.append(f'<text x="{x0 + w + 20}" y="{ly + 44}" font-size="10">here: {data["dtype"]}, {data["device"]},</text>')
    out.append(f'<text x="{x0 + w + 20}" y="{ly + 58}" font-size="10">{data["experts"]} experts, vocab '
               f'{data["vocab"]},</text>')
    out.append(f'<text x="{x0 + w + 20}" y="{ly + 72}" font-size="10">batch {data.get("batch", 1)} x seq '
               f'{data["seq"]}</text>')
    out.append("</svg>")
    with open(path, "w") as f:
        f.write("\n".join(out) + "\n")


def write(data, path):
    write_json(path, data)


if __name__ == "__main__":
    sys.exit(main())
