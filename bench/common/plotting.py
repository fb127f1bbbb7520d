"""The memory/time frontier plot (plain SVG): peak (or kept) tensor memory against step time, both over off's, one
panel per model, the budget and compile curves with off, full and selective as points. Written by
bench.budget.budget_frontier --plot and bench.scale.frontier_30b --plot."""


COLORS = {"budget": "#d62728", "compile": "#2ca02c", "off": "#444444", "full": "#1f77b4", "selective": "#9467bd"}


def _panel(x0, y0, w, h, rows, title, memory="peak_bytes", memory_label="peak tensor memory"):
    rows = [r for r in rows if "error" not in r]
    off = next(r for r in rows if r["method"] == "off")
    pts = [(r["ms_median"] / off["ms_median"], r[memory] / off[memory]) for r in rows]
    xmax = max(p[0] for p in pts) * 1.08
    xmin = min(p[0] for p in pts) * 0.92
    ymax = max(p[1] for p in pts) * 1.08
    sx = lambda v: x0 + (v - xmin) / (xmax - xmin) * w
    sy = lambda v: y0 + h - v / ymax * h
    out = [f'<text x="{x0 + w / 2}" y="{y0 - 10}" text-anchor="middle" font-size="13">{title}</text>',
           f'<line x1="{x0}" y1="{y0 + h}" x2="{x0 + w}" y2="{y0 + h}" stroke="black"/>',
           f'<line x1="{x0}" y1="{y0}" x2="{x0}" y2="{y0 + h}" stroke="black"/>',
           f'<text x="{x0 + w / 2}" y="{y0 + h + 34}" text-anchor="middle" font-size="11">step time / off</text>',
           f'<text x="{x0 - 40}" y="{y0 + h / 2}" text-anchor="middle" font-size="11" '
           f'transform="rotate(-90 {x0 - 40} {y0 + h / 2})">{memory_label} / off</text>']
    for i in range(5):
        v = ymax * i / 4
        out.append(f'<text x="{x0 - 6}" y="{sy(v) + 4:.1f}" text-anchor="end" font-size="10">{v:.2f}</text>')
        out.append(f'<line x1="{x0}" y1="{sy(v):.1f}" x2="{x0 + w}" y2="{sy(v):.1f}" stroke="#ddd"/>')
        u = xmin + (xmax - xmin) * i / 4
        out.append(f'<text x="{sx(u):.1f}" y="{y0 + h + 16}" text-anchor="middle" font-size="10">{u:.2f}</text>')
    for family in ("budget", "compile"):
        curve = sorted((r for r in rows if r["family"] == family), key=lambda r: r["budget"])
        if not curve:
            continue
        xy = [(sx(r["ms_median"] / off["ms_median"]), sy(r[memory] / off[memory])) for r in curve]
        out.append(f'<polyline points="{" ".join(f"{x:.1f},{y:.1f}" for x, y in xy)}" fill="none" '
                   f'stroke="{COLORS[family]}" stroke-width="1.5"/>')
        for (x, y), r in zip(xy, curve):
            out.append(f'<circle cx="{x:.1f}" cy="{y:.1f}" r="2.5" fill="{COLORS[family]}"/>')
            if r["budget"] in (0.0, 0.5, 1.0):
                out.append(f'<text x="{x + 4:.1f}" y="{y - 4:.1f}" font-size="9" fill="{COLORS[family]}">'
                           f'{r["budget"]}</text>')
    for name in ("off", "full", "selective"):
        r = next(r for r in rows if r["method"] == name)
        x, y = sx(r["ms_median"] / off["ms_median"]), sy(r[memory] / off[memory])
        out.append(f'<rect x="{x - 4:.1f}" y="{y - 4:.1f}" width="8" height="8" fill="{COLORS[name]}"/>')
        out.append(f'<text x="{x + 6:.1f}" y="{y + 12:.1f}" font-size="10" fill="{COLORS[name]}">{name}</text>')
    return out


def plot(data, path, memory="peak_bytes", memory_label="peak tensor memory"):
    models = list(data["models"].items())
    w, h, pad = 360, 260, 80
    width = len(models) * (w + pad) + pad
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{h + 150}" font-family="sans-serif">',
           f'<rect width="{width}" height="{h + 150}" fill="white"/>']
    for i, (name, d) in enumerate(models):
        out += _panel(pad + i * (w + pad), 40, w, h, d["rows"], name, memory, memory_label)
    y = h + 110
    x = pad
    for family, label in [("budget", "hpac budget 0…1"), ("compile", "torch.compile activation_memory_budget 0…1"),
                          ("off", "off"), ("full", "full"), ("selective", "selective (fixed)")]:
        out.append(f'<rect x="{x}" y="{y - 9}" width="10" height="10" fill="{COLORS[family]}"/>')
        out.append(f'<text x="{x + 14}" y="{y}" font-size="11">{label}</text>')
        x += 40 + 7 * len(label)
    out.append("</svg>")
    with open(path, "w") as f:
        f.write("\n".join(out) + "\n")
