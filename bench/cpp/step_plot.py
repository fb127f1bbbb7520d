"""Turns bench/results/step.json (Google Benchmark JSON of hpac_bench_step) into an SVG plot: peak and kept tensor
memory and step time versus sequence length, one line per mode, for one layer count. No plotting library needed.

    /usr/bin/python3 -m bench.cpp.step_plot bench/results/step.json docs/results_step.svg [--layers 4]
"""
import argparse
import json
import re

MODES = [("off", "#444444"), ("full", "#1f77b4"), ("selective", "#d62728")]
PANELS = [("peak_MiB", "peak tensor MiB (step)"), ("kept_MiB", "tensor MiB kept after forward"), ("ms", "step time, ms")]


def load(path, layers):
    rows = []
    with open(path) as f:
        data = json.load(f)
    for b in data["benchmarks"]:
        m = re.match(r"BM_Step/seq:(\d+)/layers:(\d+)", b["name"])
        if not m or b.get("run_type") == "aggregate" or int(m.group(2)) != layers:
            continue
        rows.append({"seq": int(m.group(1)), **{k: v for k, v in b.items() if isinstance(v, (int, float))}})
    if not rows:
        raise SystemExit(f"no BM_Step rows with layers={layers} in {path}")
    return sorted(rows, key=lambda r: r["seq"]), data.get("context", {})


def panel(x0, y0, w, h, rows, key, title):
    seqs = [r["seq"] for r in rows]
    ymax = max(r[f"{m}_{key}"] for r in rows for m, _ in MODES) * 1.1 or 1
    sx = lambda s: x0 + (seqs.index(s) / max(len(seqs) - 1, 1)) * w
    sy = lambda v: y0 + h - v / ymax * h
    out = [f'<text x="{x0 + w / 2}" y="{y0 - 12}" text-anchor="middle" font-size="13">{title}</text>',
           f'<line x1="{x0}" y1="{y0 + h}" x2="{x0 + w}" y2="{y0 + h}" stroke="black"/>',
           f'<line x1="{x0}" y1="{y0}" x2="{x0}" y2="{y0 + h}" stroke="black"/>']
    for i in range(5):
        v = ymax * i / 4
        out.append(f'<text x="{x0 - 6}" y="{sy(v) + 4}" text-anchor="end" font-size="10">{v:.0f}</text>')
        out.append(f'<line x1="{x0}" y1="{sy(v)}" x2="{x0 + w}" y2="{sy(v)}" stroke="#ddd"/>')
    for s in seqs:
        out.append(f'<text x="{sx(s)}" y="{y0 + h + 16}" text-anchor="middle" font-size="10">{s}</text>')
    out.append(f'<text x="{x0 + w / 2}" y="{y0 + h + 32}" text-anchor="middle" font-size="11">sequence length</text>')
    for mode, color in MODES:
        pts = " ".join(f"{sx(r['seq']):.1f},{sy(r[f'{mode}_{key}']):.1f}" for r in rows)
        out.append(f'<polyline points="{pts}" fill="none" stroke="{color}" stroke-width="2"/>')
        for r in rows:
            out.append(f'<circle cx="{sx(r["seq"]):.1f}" cy="{sy(r[f"{mode}_{key}"]):.1f}" r="3" fill="{color}"/>')
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("step_json")
    ap.add_argument("svg")
    ap.add_argument("--layers", type=int, default=4)
    a = ap.parse_args()
    rows, ctx = load(a.step_json, a.layers)
    w, h, gap = 260, 200, 90
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{3 * w + 4 * gap}" height="{h + 150}" '
             'font-family="sans-serif">', '<rect width="100%" height="100%" fill="white"/>']
    for i, (key, title) in enumerate(PANELS):
        parts += panel(gap + i * (w + gap), 40, w, h, rows, key, title)
    lx = gap
    for mode, color in MODES:
        parts.append(f'<rect x="{lx}" y="{h + 100}" width="14" height="4" fill="{color}"/>')
        parts.append(f'<text x="{lx + 20}" y="{h + 106}" font-size="12">{mode}</text>')
        lx += 110
    parts.append(f'<text x="{lx + 20}" y="{h + 106}" font-size="11">hpac_bench_step, {a.layers} Qwen3-MoE-shaped blocks, '
                 f'hidden 128, batch 1, fp32 CPU ({ctx.get("num_cpus", "?")} CPUs, {ctx.get("date", "")})</text>')
    parts.append("</svg>")
    with open(a.svg, "w") as f:
        f.write("\n".join(parts) + "\n")
    print(f"wrote {a.svg} ({len(rows)} sequence lengths, layers {a.layers})")


if __name__ == "__main__":
    main()
