"""The budget frontier at Qwen3-30B-A3B's real layer shapes, measured side by side in one process.

transformers' Qwen3MoeForCausalLM built from a config with the real layer dimensions (hidden 2048, 32 query / 4 KV
heads of 128, 128 experts top-8, expert width 768, norm_topk_prob; the preset qwen3_moe_30b_a3b), --layers decoder
layers, the vocabulary cut to --vocab, random weights, batch 1. One model per (seq, dtype): a layer's experts alone
are 604M parameters, so the methods share it, each step re-wrapping the decoder layers (hpac.checkpoint_wrapper;
off unwrapped):
  off, full, selective      no checkpoint; hpac full; hpac's fixed selective policy
  budget:<f>                hpac.budget(f), one region per layer, kept across steps (profiled on the warm-up step)
  compile:<f>               torch.compile of the unwrapped model with activation_memory_budget = f (--compile-budgets;
                            each compiled and warmed up on its own, its steps alternated with off steps)
  context_fn:<f>            hpac.budget(f) under torch.utils.checkpoint's frame (hpac.context_fn; --methods only)
  compile:hpac_selective    torch.compile of the model with hpac's selective policy on every layer (traced through
                            its context_fn), when --compile-budgets is given
One step is forward + backward (no optimizer); step 0 is a warm-up; the eager methods run interleaved, the order
rotated every step. Per method: step time (median, min–max), peak tensor bytes above the step's start (hpac's
tracking CPU allocator) and the bytes the forward left for backward (kept: the activations, what checkpointing
controls), each as a ratio to off; every step the same token batch, and each method's gradients against the first
off step's (max |dgrad|; off against itself gives the floor: transformers' expert loop on CPU is not bitwise
deterministic from run to run at these shapes). GLIBC_TUNABLES as the demo sets it.

    GLIBC_TUNABLES=glibc.malloc.mmap_threshold=33554432:glibc.malloc.trim_threshold=4294967296 \\
    .venv/bin/python -m bench.scale.frontier_30b [--seqs 512,1024] [--dtypes float32] [--steps 5] [--compile-budgets 0.5]
    .venv/bin/python -m bench.scale.frontier_30b --plot bench/results/frontier_30b.json docs/results_frontier_30b.svg
"""
import argparse
import gc
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

from bench.common import RESULTS
from bench.common.frontier import start_results
from bench.common.plotting import plot
from bench.common.timing import timed_step

DEFAULT_OUT = os.path.join(RESULTS, "frontier_30b.json")
FRACTIONS = (0.0, 0.25, 0.5, 0.75, 1.0)
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


def build(layers, vocab, seq, dtype):
    import transformers
    import hpac.hf as hf
    transformers.logging.set_verbosity_error()
    config = hf.parse_config(f"model: {{preset: qwen3_moe_30b_a3b, num_layers: {layers}, vocab_size: {vocab}}}\n"
                             f"train: {{seq_len: {seq}, micro_batch: 1}}\n", "frontier_30b.yaml")
    spec = config["model"]
    return hm.qwen3_moe_model(spec, 1234, dtype=dtype, max_position_embeddings=max(4096, seq)), spec


def step(model, ids):
    """(seconds, peak bytes above the start, bytes kept after the forward) of one step; the gradients stay in .grad."""
    return timed_step(model, lambda m, x: m(input_ids=x, labels=x, use_cache=False).loss, ids)


def max_abs_diff(model, reference):
    """max |grad - reference| over the parameters; inf for a NaN (never equal) or a missing gradient."""
    worst = 0.0
    with torch.no_grad():
        for p, r in zip(model.parameters(), reference):
            if p.grad is None or r is None:
                return float("inf")
            d = (p.grad - r).abs().max().item()
            worst = max(worst, d if d == d else float("inf"))
    return worst


def apply(model, mode, budgets):
    import hpac.hf as hf
    for i, layer in enumerate(model.model.layers):
        hpac.unwrap_checkpoint(layer)
        if mode == "off":
            continue
        family, _, fraction = mode.partition(":")
        if family == "context_fn":  # torch.utils.checkpoint's frame with hpac's regions (early stop: torch's default)
            hf.wrap_torch_checkpoint(layer, hpac.context_fn(budgets[fraction][i]))
            continue
        hpac.checkpoint_wrapper(layer, policy=budgets[fraction][i] if family == "budget" else family)


def row_of(mode, times, peaks, kept, dgrad, budgets=None):
    family, _, fraction = mode.partition(":")
    row = {"method": mode, "family": family, "budget": float(fraction) if fraction[:1].isdigit() else None,
           "ms_median": 1e3 * statistics.median(times), "ms_all": [1e3 * t for t in times],
           "peak_bytes": max(peaks), "kept_bytes": max(kept), "max_dgrad_vs_off": max(dgrad)}
    if budgets:
        row["regions"] = [{k: st[k] for k in ("stage", "profiles", "replans", "budget_bytes", "kept_bytes",
                                              "off_bytes", "total_bytes", "saved_ops", "skipped_ops",
                                              "planned_ops", "saved_micros", "skipped_micros", "total_micros")}
                          for st in (b.status() for b in budgets)]
    return row


def eager_rows(model, ids, steps, log, label, methods=None):
    methods = methods or ["off", "full", "selective"] + [f"budget:{f}" for f in FRACTIONS]
    fractions = sorted({m.partition(":")[2] for m in methods if ":" in m})
    budgets = {f: [hpac.budget(float(f)) for _ in model.model.layers] for f in fractions}
    times, peaks, kept, dgrad = ({m: [] for m in methods} for _ in range(4))
    reference = None
    for s in range(steps + 1):
        for mode in hc.rotated(methods, s):
            apply(model, mode, budgets)
            seconds, peak, k = step(model, ids)
            if reference is None and mode == "off":
                reference = [p.grad.clone() for p in model.parameters()]
            if s:  # step 0: warm-up, and the budget regions' profile
                times[mode].append(seconds)
                peaks[mode].append(peak)
                kept[mode].append(k)
                dgrad[mode].append(max_abs_diff(model, reference))
        log(f"{label} step {s}/{steps}: " + " ".join(f"{m} {1e3 * times[m][-1]:.0f}ms" for m in methods if times[m]))
    apply(model, "off", budgets)
    rows = [row_of(m, times[m], peaks[m], kept[m], dgrad[m],
                   budgets[m.partition(":")[2]] if ":" in m else None) for m in methods]
    del reference
    return rows


def compile_rows(model, ids, steps, fractions, log, label):
    import torch._functorch.config as functorch_config
    rows = []
    previous = functorch_config.activation_memory_budget
    step(model, ids)
    reference = [p.grad.clone() for p in model.parameters()]
    try:
        for f in list(fractions) + ["hpac_selective"]:
            torch._dynamo.reset()
            hpac_selective = f == "hpac_selective"  # hpac's selective policy compiled (its context_fn, traced)
            functorch_config.activation_memory_budget = previous if hpac_selective else f
            apply(model, "selective" if hpac_selective else "off", None)
            compiled = torch.compile(model)
            t0 = time.perf_counter()
            try:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    step(compiled, ids)
            except Exception as e:  # reported, not hidden: the row says why there is no figure
                rows.append({"method": f"compile:{f}", "family": "compile_hpac" if hpac_selective else "compile",
                             "budget": None if hpac_selective else f,
                             "error": f"{type(e).__name__}: {str(e).splitlines()[0][:300]}"})
                apply(model, "off", None)
                log(f"{label} compile {f}: {rows[-1]['error']}")
                continue
            compile_s = time.perf_counter() - t0
            times, peaks, kept, off_times, dgrad = [], [], [], [], []
            for s in range(1, steps + 1):
                pair = [("compile", compiled), ("off", model)]
                for name, mod in (pair if s % 2 else pair[::-1]):
                    if hpac_selective:  # the off steps run the same module unwrapped (the compiled one wraps it)
                        apply(model, "selective" if name == "compile" else "off", None)
                    seconds, peak, k = step(mod, ids)
                    if name == "compile":
                        times.append(seconds), peaks.append(peak), kept.append(k)
                        dgrad.append(max_abs_diff(model, reference))
                    else:
                        off_times.append(seconds)
            row = row_of(f"compile:{f}", times, peaks, kept, dgrad)
            if hpac_selective:
                row.update({"family": "compile_hpac", "budget": None})
                apply(model, "off", None)
            row.update({"off_ms_median_alongside": 1e3 * statistics.median(off_times), "compile_s": compile_s})
            rows.append(row)
            log(f"{label} compile {f}: compiled in {compile_s:.0f}s, {row['ms_median']:.0f}ms vs off "
                f"{row['off_ms_median_alongside']:.0f}ms")
    finally:
        functorch_config.activation_memory_budget = previous
        torch._dynamo.reset()
    return rows


def against_target(rows):
    """The issue's targets read off the rows: at selective's peak (and at its kept bytes), the fastest budget point
    and how much faster than selective it is; budget 1.0's step time against off's (and under torch's frame, where
    measured); with min–max ranges."""
    by = {r["method"]: r for r in rows if "error" not in r}
    off, sel = by["off"], by.get("selective")
    budget = [r for r in rows if r.get("family") == "budget"]
    out = {}
    for memory in ("peak_bytes", "kept_bytes") if sel else ():
        fits = [r for r in budget if r[memory] <= sel[memory]]
        best = min(fits, key=lambda r: r["ms_median"]) if fits else None
        out[f"at_selective_{memory}"] = None if best is None else {
            "budget": best["budget"], "faster_than_selective": 1 - best["ms_median"] / sel["ms_median"],
            "ranges_apart": max(best["ms_all"]) < min(sel["ms_all"]), "target": 0.15}
    for method, key in (("budget:1.0", "budget_1_vs_off"), ("context_fn:1.0", "context_fn_1_vs_off")):
        one = by.get(method)
        if one:
            out[key] = {"time_ratio": one["ms_median"] / off["ms_median"], "target": 1.03,
                        "ranges_overlap": min(one["ms_all"]) <= max(off["ms_all"])
                        and min(off["ms_all"]) <= max(one["ms_all"])}
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--layers", type=int, default=1)
    ap.add_argument("--vocab", type=int, default=4096)
    ap.add_argument("--seqs", default="512,1024")
    ap.add_argument("--dtypes", default="float32", help="comma-separated: " + ", ".join(DTYPES))
    ap.add_argument("--steps", type=int, default=5, help="measured steps per method, after one warm-up")
    ap.add_argument("--compile-budgets", default="", help="activation_memory_budget values for torch.compile "
                                                          "(comma-separated; empty: no compile rows)")
    ap.add_argument("--compile-steps", type=int, default=3)
    ap.add_argument("--methods", default="", help="comma-separated eager methods instead of the frontier's (off first): "
                                                  "off, full, selective, budget:<f>, context_fn:<f> (hpac.budget(f) "
                                                  "under torch.utils.checkpoint's frame)")
    ap.add_argument("--out", default=DEFAULT_OUT)
    ap.add_argument("--plot", nargs=2, metavar=("JSON", "SVG"), help="only draw the plot of a results file: kept bytes "
                                                                   "after the forward against step time, per model")
    a = ap.parse_args()
    if a.plot:
        with open(a.plot[0]) as f:
            plot(json.load(f), a.plot[1], "kept_bytes", "kept after forward")
        return 0
    try:
        seqs = [int(s) for s in a.seqs.split(",")]
        compile_budgets = [float(f) for f in a.compile_budgets.split(",") if f]
    except ValueError:
        ap.error("--seqs takes comma-separated integers, --compile-budgets comma-separated fractions")
    dtypes = a.dtypes.split(",")
    bad = [d for d in dtypes if d not in DTYPES]
    if bad:
        ap.error(f"--dtypes {','.join(bad)} is not allowed; allowed: {', '.join(DTYPES)}")
    methods = [m for m in a.methods.split(",") if m]
    wrong = [m for m in methods if m not in ("off", "full", "selective") and not (
        m.partition(":")[0] in ("budget", "context_fn") and m.partition(":")[2].replace(".", "", 1).isdigit())]
    if wrong or (methods and methods[0] != "off"):
        ap.error(f"--methods {a.methods!r} is not allowed; allowed: off first, then full, selective, budget:<f>, "
                 "context_fn:<f> (f in [0, 1])")
    if min([a.layers, a.vocab, a.steps, a.compile_steps] + seqs) < 1:
        ap.error("--layers, --vocab, --steps, --compile-steps and --seqs must be positive integers")
    data, log, save = start_results("frontier_30b", a.out, a.steps, a.compile_steps, FRACTIONS)
    for dtype in dtypes:
        for seq in seqs:
            label = f"qwen3_30b_a3b_{a.layers}L_seq{seq}_{dtype}"
            model, spec = build(a.layers, a.vocab, seq, DTYPES[dtype])
            data["model"] = spec
            ids = hm.token_batch(a.vocab, 1, seq, 1234, 0)
            rows = eager_rows(model, ids, a.steps, log, label, methods)
            entry = data["models"][label] = {
                "shape": (f"transformers Qwen3MoeForCausalLM at Qwen3-30B-A3B's layer shapes, {a.layers} layer(s), "
                          f"vocab {a.vocab}, seq {seq} x batch 1, {dtype}"),
                "rows": rows, "against_target": against_target(rows)}
            save()
            log(f"{label}: {json.dumps(entry['against_target'])}")
            if compile_budgets:
                rows += compile_rows(model, ids, a.compile_steps, compile_budgets, log, label)
                save()
            del model
            gc.collect()
    log(f"wrote {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
