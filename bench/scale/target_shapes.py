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
import sys

import torch

from bench.common import RESULTS, ROOT
from bench.common.target_shapes import DEFAULT_BATCH, DTYPES, MODES, run
from bench.common.target_shapes_table import target_shapes_table

DEFAULT_OUT = os.path.join(RESULTS, "target_shapes.json")


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
    print("\n".join(target_shapes_table(data)))
    return 0


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


if __name__ == "__main__":
    sys.exit(main())
