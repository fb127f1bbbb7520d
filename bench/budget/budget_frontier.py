"""The memory/time frontier of hpac's budget policy, measured side by side in one process.

Two models:
  qwen3_moe   the main job's model: the transformers Qwen3MoeForCausalLM of examples/training_demo/train.yaml
              (hpac.harness.demo's; hpac.hf.prepare applies each mode), token batches as hpac-train's
  moe_block   the block benchmark's Qwen3-MoE-style block (hpac.harness.blocks; bench/cpp/step_benchmark.cpp's
              shape: hidden 128, 4 heads, 4 experts top-2, expert width 192, batch 1), a stack of --block-layers,
              eager attention, no dropout; each block through hpac.checkpoint_wrapper
Methods, each on its own copy of the model (same seed):
  off, full, selective          no checkpoint; hpac full; hpac's fixed selective policy
  budget:<f>                    hpac.budget(f), one region per layer (profile on the first step, plan after)
  compile:<f>                   torch.compile of the whole model with
                                torch._functorch.config.activation_memory_budget = f (torch >= 2.4)
One step is forward + backward (no optimizer). The eager methods run interleaved, the order rotated every step;
step 0 is a warm-up (and the budget regions' profile) and is not measured. Each compile method is compiled and
warmed up on its own (torch._dynamo.reset() between budgets, since the budget is read at compile time), then its
steps alternate with steps of a fresh `off` model so each compile point has an off reference from the same minutes.
Peak = tensor bytes above the step's start (hpac's tracking CPU allocator; every method alike); time = median of the
measured steps. The eager methods' gradients are compared with off's at every step (bit for bit, NaN never equal).

    GLIBC_TUNABLES=glibc.malloc.mmap_threshold=33554432:glibc.malloc.trim_threshold=4294967296 \\
    .venv/bin/python -m bench.budget.budget_frontier [--steps 6] [--compile-steps 3] [--out bench/results/budget_frontier.json]
    .venv/bin/python -m bench.budget.budget_frontier --plot bench/results/budget_frontier.json docs/results_budget.svg
"""
import argparse
import json
import os
import statistics
import sys
import time
import warnings

import torch

import hpac
import hpac.harness.compare as hc
from hpac.harness.blocks import Block
from hpac.harness.parity import compare

from bench.common import CONFIG, RESULTS, torch_at_least
from bench.common.frontier import start_results
from bench.common.plotting import plot
from bench.common.timing import measure

FRACTIONS = [round(0.1 * i, 1) for i in range(11)]
MODELS = ("qwen3_moe", "moe_block", "moe_block_wide")
DEFAULT_OUT = os.path.join(RESULTS, "budget_frontier.json")
TARGET = {"faster_at_selective_memory": 0.15, "less_memory_at_full_time": 0.30}


class Model:
    """A model family: build() gives a fresh copy (same seed), batch(step) the inputs, loss(model, inputs)."""


def qwen3_moe(config_path, seq=None, batch=None):
    import transformers
    transformers.logging.set_verbosity_error()
    import hpac.hf as hf
    import hpac.harness.compare as hc
    import hpac.harness.models as hm
    config = hf.load_config(config_path)
    spec, train = config["model"], config["train"]
    train["seq_len"] = seq or train["seq_len"]
    train["micro_batch"] = batch or train["micro_batch"]
    m = Model()
    m.name, m.config = "qwen3_moe", config
    m.shape = (f"transformers Qwen3MoeForCausalLM, {spec['num_layers']} layers, hidden {spec['hidden_size']}, "
               f"{spec['num_experts']} experts top-{spec['num_experts_per_tok']}, seq {train['seq_len']} x batch "
               f"{train['micro_batch']}, fp32")

    def build():
        return hm.qwen3_moe_model(spec, train["seed"])

    m.build = build
    m.batch = lambda step: hm.token_batch(spec["vocab_size"], train["micro_batch"], train["seq_len"], train["seed"],
                                          step)
    m.loss = lambda model, ids: model(input_ids=ids, labels=ids).loss
    registry = hf.load_registry()

    def prepare(model, mode):
        prep = hf.prepare(model, hc.mode_config(config, mode), registry, log=None)
        return [layer.budget for layer in prep.layers if layer.budget is not None]

    m.prepare = prepare
    return m


def moe_block(layers, seq, hidden=128, name="moe_block"):
    m = Model()
    m.name = name
    heads, inter = max(4, hidden // 64), hidden * 3 // 2
    m.shape = (f"{layers} Qwen3-MoE-style blocks (hpac.harness.blocks), hidden {hidden}, {heads} heads, "
               f"4 experts top-2, expert width {inter}, eager attention, seq {seq} x batch 1, fp32")

    def build():
        torch.manual_seed(0)
        model = torch.nn.Sequential(*[Block(hidden=hidden, heads=heads, experts=4, inter=inter, top_k=2, dropout=0.0)
                                      for _ in range(layers)])
        model.train()
        return model

    torch.manual_seed(1)
    x0 = torch.randn(1, seq, hidden)
    m.build = build
    m.batch = lambda step: x0
    m.loss = lambda model, x: model(x).pow(2).mean()

    def prepare(model, mode):
        if mode == "off":
            return []
        name, _, fraction = mode.partition(":")
        budgets = []
        for block in model:
            policy = name
            if name == "budget":
                policy = hpac.budget(float(fraction))
                budgets.append(policy)
            hpac.checkpoint_wrapper(block, policy=policy)
        return budgets

    m.prepare = prepare
    return m


def eager_rows(m, steps, log):
    methods = ["off", "full", "selective"] + [f"budget:{f}" for f in FRACTIONS]
    runs = {}
    for mode in methods:
        model = m.build()
        runs[mode] = {"model": model, "budgets": m.prepare(model, mode), "times": [], "peaks": [], "bitwise": True}
    for step in range(steps + 1):
        inputs = m.batch(step)
        order = hc.rotated(methods, step)
        grads = {}
        for mode in order:
            r = runs[mode]
            seconds, peak, grads[mode] = measure(r["model"], m.loss, inputs)
            if step > 0:  # step 0: warm-up and the budget regions' profile
                r["times"].append(seconds)
                r["peaks"].append(peak)
        for mode in methods:
            runs[mode]["bitwise"] &= compare(grads[mode], grads["off"])[0] == 0
        log(f"{m.name} eager step {step}/{steps}: " +
            " ".join(f"{mode} {1e3 * statistics.median(runs[mode]['times']):.0f}ms" for mode in methods[:4]
                     if runs[mode]["times"]))
    rows = []
    for mode in methods:
        r = runs[mode]
        family, _, fraction = mode.partition(":")
        row = {"method": mode, "family": family, "budget": float(fraction) if fraction else None,
               "ms_median": 1e3 * statistics.median(r["times"]), "ms_all": [1e3 * t for t in r["times"]],
               "peak_bytes": max(r["peaks"]), "grads_bitwise_equal_off": bool(r["bitwise"])}
        if r["budgets"]:
            sts = [b.status() for b in r["budgets"]]
            row["regions"] = [{k: st[k] for k in ("stage", "profiles", "replans", "budget_bytes", "kept_bytes",
                                                  "off_bytes", "total_bytes", "saved_ops", "skipped_ops",
                                                  "planned_ops", "saved_micros", "skipped_micros", "total_micros")}
                              for st in sts]
        rows.append(row)
    return rows


def compile_rows(m, steps, log, fractions, on_row):
    import torch._functorch.config as functorch_config
    rows = []
    previous = functorch_config.activation_memory_budget
    try:
        for f in fractions:
            torch._dynamo.reset()
            functorch_config.activation_memory_budget = f
            model = m.build()
            compiled = torch.compile(model)
            off = m.build()
            t0 = time.perf_counter()
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                measure(compiled, m.loss, m.batch(0))  # compiles forward and backward
            compile_s = time.perf_counter() - t0
            measure(off, m.loss, m.batch(0))
            times, peaks, off_times = [], [], []
            for step in range(1, steps + 1):
                pair = [("compile", compiled), ("off", off)]
                for name, mod in (pair if step % 2 else pair[::-1]):
                    seconds, peak, _ = measure(mod, m.loss, m.batch(step))
                    if name == "compile":
                        times.append(seconds)
                        peaks.append(peak)
                    else:
                        off_times.append(seconds)
            rows.append({"method": f"compile:{f}", "family": "compile", "budget": f,
                         "ms_median": 1e3 * statistics.median(times), "ms_all": [1e3 * t for t in times],
                         "peak_bytes": max(peaks), "off_ms_median_alongside": 1e3 * statistics.median(off_times),
                         "compile_s": compile_s})
            log(f"{m.name} compile budget {f}: compiled in {compile_s:.0f}s, {rows[-1]['ms_median']:.0f}ms vs off "
                f"{rows[-1]['off_ms_median_alongside']:.0f}ms, peak {max(peaks) / 2**20:.1f}MiB")
            on_row(rows[-1])
    finally:
        functorch_config.activation_memory_budget = previous
        torch._dynamo.reset()
    return rows


def _best_within(budget, ref, bound, optimise):
    """(the budget point with `bound` <= ref's and the least `optimise`, None), or (None, the least-`bound` point)."""
    fits = [r for r in budget if r[bound] <= ref[bound]]
    if fits:
        return min(fits, key=lambda r: r[optimise]), None
    return None, min(budget, key=lambda r: r[bound])


def against_target(rows):
    """The budget curve against the fixed policies (the issue's target)."""
    by = {r["method"]: r for r in rows}
    sel, full = by["selective"], by["full"]
    budget = [r for r in rows if r["family"] == "budget"]
    out = {"target": TARGET}
    best, closest = _best_within(budget, sel, "peak_bytes", "ms_median")
    out["at_selective_memory"] = (
        {"budget": best["budget"], "faster": 1 - best["ms_median"] / sel["ms_median"],
         "peak_vs_selective": best["peak_bytes"] / sel["peak_bytes"]} if best else
        {"budget": None, "least_budget_peak_vs_selective": closest["peak_bytes"] / sel["peak_bytes"]})
    best, closest = _best_within(budget, full, "ms_median", "peak_bytes")
    out["at_full_time"] = (
        {"budget": best["budget"], "less_memory": 1 - best["peak_bytes"] / full["peak_bytes"],
         "time_vs_full": best["ms_median"] / full["ms_median"]} if best else
        {"budget": None, "fastest_budget_time_vs_full": closest["ms_median"] / full["ms_median"]})
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default=",".join(MODELS), help="comma-separated: " + ", ".join(MODELS))
    ap.add_argument("--wide-hidden", type=int, default=512, help="moe_block_wide's hidden size")
    ap.add_argument("--wide-seq", type=int, default=1024, help="moe_block_wide's sequence length")
    ap.add_argument("--config", default=CONFIG)
    ap.add_argument("--seq", type=int, help="override the config's train.seq_len (qwen3_moe)")
    ap.add_argument("--batch", type=int, help="override the config's train.micro_batch (qwen3_moe)")
    ap.add_argument("--block-layers", type=int, default=2)
    ap.add_argument("--block-seq", type=int, default=256)
    ap.add_argument("--steps", type=int, default=3, help="measured eager steps per method (after one warm-up)")
    ap.add_argument("--compile-steps", type=int, default=2, help="measured steps per compile budget")
    ap.add_argument("--no-compile", action="store_true")
    ap.add_argument("--compile-budgets", default=",".join(str(f) for f in FRACTIONS),
                    help="activation_memory_budget values for torch.compile (default: the same as hpac's)")
    ap.add_argument("--out", default=DEFAULT_OUT)
    ap.add_argument("--plot", nargs=2, metavar=("JSON", "SVG"), help="only draw the plot of a results file")
    a = ap.parse_args()
    if a.plot:
        with open(a.plot[0]) as f:
            plot(json.load(f), a.plot[1])
        return 0
    if min(a.steps, a.compile_steps, a.block_layers, a.block_seq) < 1:
        ap.error("--steps, --compile-steps, --block-layers and --block-seq must be positive integers")
    names = a.models.split(",")
    unknown = [n for n in names if n not in MODELS]
    if unknown:
        ap.error(f"--models {','.join(unknown)} is not allowed; allowed: {', '.join(MODELS)}")
    with_compile = not a.no_compile and torch_at_least(2, 4)
    compile_budgets = [float(f) for f in a.compile_budgets.split(",")]
    data, log, save = start_results("budget_frontier", a.out, a.steps, a.compile_steps, FRACTIONS)
    for name in names:
        if name == "qwen3_moe":
            m = qwen3_moe(a.config, a.seq, a.batch)
        elif name == "moe_block":
            m = moe_block(a.block_layers, a.block_seq)
        else:  # moe_block_wide: kernels, not Python, set the step time
            m = moe_block(a.block_layers, a.wide_seq, hidden=a.wide_hidden, name=name)
        rows = eager_rows(m, a.steps, log)
        entry = data["models"][name] = {"shape": m.shape, "rows": rows, "against_target": against_target(rows)}
        save()
        log(f"{name}: {json.dumps(entry['against_target'])}")
        if with_compile:
            compile_rows(m, a.compile_steps, log, compile_budgets, lambda row: (rows.append(row), save()))
    log(f"wrote {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
