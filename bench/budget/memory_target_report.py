"""docs/results.md "Fit a step into N bytes" (section memory_target), from bench/results/memory_target.json
(bench/budget/memory_target.py)."""
from bench.common.report import load, tunables


def _mib(b):
    return f"{b / 2**20:.2f} MiB"


def _shapes(d):
    if d.get("shapes") == "30b":
        m = d["model"]
        return (f"Qwen3-30B-A3B's layer shapes, {m['num_layers']} layers, {m['num_experts']} experts, vocabulary "
                f"{m['vocab_size']}, batch {d['batch']} x seq {d['seq']}, float32")
    return f"`{d['config']}`"


def _plan(layers):
    return " ".join(f"{l['kept_bytes'] / 2**20:.2f}" if l["checkpointed"] else "off" for l in layers)


def _memtracker(row):
    m = row.get("memtracker")
    if not m:
        return "n/a"
    return f"{100 * (m['memtracker_peak_bytes'] - m['hpac_peak_bytes']) / m['hpac_peak_bytes']:+.2f}%"


def _counted(d):
    """Which steps a run's peak is the largest of: every step since the first was counted, the timed ones before."""
    if all("steps_over_target" in s for s in d["sweep"] if "error" not in s):
        return "every step, warm-up and the first included"
    return "the timed steps (the warm-up left out: a run before every step was counted)"


def _first(s):
    return _mib(s["first_step_bytes"]) if "first_step_bytes" in s else "n/a"


def _over(s):
    return f"{s['steps_over_target']} of {len(s['steps'])}" if "steps_over_target" in s else "n/a"


def plot(d, path):
    """docs/results_memory_target.svg: per target, the measured and predicted step peak against the target line,
    and the fixed modes' measured peaks as a scale on the right (python -m bench.budget.memory_target --plot)."""
    sweep, fixed = d["sweep"], d["fixed"]
    values = [s["target_bytes"] for s in sweep] + [s["measured_bytes"] for s in sweep] + \
        [f["peak_bytes"] for f in fixed.values()]
    lo, hi = min(values) * 0.95 / 2**20, max(values) * 1.03 / 2**20
    w, h, x0, y0 = 460, 300, 70, 30
    sx = lambda v: x0 + (v / 2**20 - lo) / (hi - lo) * w
    sy = lambda v: y0 + h - (v / 2**20 - lo) / (hi - lo) * h
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{x0 + w + 200}" height="{y0 + h + 70}" '
           'font-family="sans-serif" font-size="11">', f'<rect width="{x0 + w + 200}" height="{y0 + h + 70}" '
           'fill="white"/>', f'<line x1="{sx(lo * 2**20)}" y1="{sy(lo * 2**20)}" x2="{sx(hi * 2**20)}" '
           f'y2="{sy(hi * 2**20)}" stroke="#999" stroke-dasharray="4 3"/>',
           f'<rect x="{x0}" y="{y0}" width="{w}" height="{h}" fill="none" stroke="#333"/>']
    for k in range(5):
        v = lo + (hi - lo) * k / 4
        out.append(f'<text x="{x0 - 6}" y="{sy(v * 2**20) + 4}" text-anchor="end">{v:.0f}</text>')
        out.append(f'<text x="{sx(v * 2**20)}" y="{y0 + h + 16}" text-anchor="middle">{v:.0f}</text>')
    for s in sweep:
        x = sx(s["target_bytes"])
        out.append(f'<circle cx="{x}" cy="{sy(s["measured_bytes"])}" r="4" fill="#1f77b4"/>')
        out.append(f'<path d="M{x - 4},{sy(s["predicted_bytes"])} h8" stroke="#d62728" stroke-width="2"/>')
    for name, f in fixed.items():
        y = sy(f["peak_bytes"])
        out.append(f'<line x1="{x0 + w}" y1="{y}" x2="{x0 + w + 8}" y2="{y}" stroke="#2ca02c"/>')
        out.append(f'<text x="{x0 + w + 11}" y="{y + 4}" fill="#2ca02c" font-size="9">{name}</text>')
    out += [f'<text x="{x0 + w / 2}" y="{y0 + h + 34}" text-anchor="middle">target (MiB)</text>',
            f'<text x="14" y="{y0 + h / 2}" transform="rotate(-90 14 {y0 + h / 2})" text-anchor="middle">step peak '
            '(MiB)</text>',
            f'<text x="{x0}" y="18">measured peak (dots), predicted (red dashes), the target (grey diagonal); '
            'fixed modes\' measured peaks (right)</text>', "</svg>"]
    with open(path, "w") as f:
        f.write("\n".join(out) + "\n")


def memory_target(r):
    """The target sweep on the main job: per target the plan, predicted and measured peak, slack, step time beside
    the fastest fixed mode that fits."""
    return _sweep(load(r, "memory_target.json"))


def memory_target_30b(r):
    """The same sweep at Qwen3-30B-A3B's layer shapes, 1, 2 and 4 layers (python -m bench.budget.memory_target --shapes 30b)."""
    out = []
    for layers in (1, 2, 4):
        d = load(r, f"memory_target_30b_{layers}.json")
        out += [f"**{layers} layer{'s' if layers > 1 else ''}** (`bench/results/memory_target_30b_{layers}.json`)", ""]
        out += _sweep(d) + [""]
    return out[:-1]


def _sweep(d):
    load_avg = f", 1-minute load average {d['load_average_at_end']:.1f} at the end" if "load_average_at_end" in d else ""
    fixed = d["fixed"]
    commit = f" at commit {d['commit']}" if d.get("commit") else ""
    out = [f"Measured by `bench/budget/memory_target.py`{commit} (torch {d['torch']}, {d['threads']} thread on {d['cpus']} CPUs"
           f"{load_avg}, GLIBC_TUNABLES={tunables(d)}; {_shapes(d)}, AdamW; "
           f"{d['warmup']} warm-up and {d['steps']} timed steps per run, one run after another in one process; "
           "peak: the process's live CPU tensor bytes over forward, backward and optimizer step, the largest of "
           f"{_counted(d)}; time: median thread CPU time of the same over the timed steps).", "",
           "Fixed modes: " + ", ".join(f"{m} {_mib(f['peak_bytes'])} / {f['median_thread_s'] * 1e3:.0f} ms"
                                      for m, f in fixed.items()) + ".", "",
           "| target | plan (MiB kept per layer, off: unwrapped) | predicted peak (event) | measured peak (event) | "
           "step 1 | steps over | slack | prediction error | MemTracker's error | step time | fastest fixed mode "
           "that fits | its time | ratio | loss = off |",
           "|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---|---:|---:|---|"]
    for s in d["sweep"]:
        if "error" in s:
            floor = s["error"].split("floor ")[1].split(" (")[0] if "floor " in s["error"] else "?"
            out.append(f"| {_mib(s['target_bytes'])} | below the predicted floor {floor}: MemoryTargetError at step 2's "
                       "start | | | | | | | | | | | | |")
            continue
        best = s["fastest_fixed"]
        ratio = f"{s['median_thread_s'] / s['fastest_fixed_thread_s']:.2f}×" if best else "n/a"
        out.append(f"| {_mib(s['target_bytes'])} | {_plan(s['layers'])} | {_mib(s['predicted_bytes'])} "
                   f"({s['predicted_event']}) | {_mib(s['measured_bytes'])} ({s['measured_event']}) | "
                   f"{_first(s)} | {_over(s)} | {100 * s['slack']:.1f}% | {100 * s['prediction_error']:+.2f}% | {_memtracker(s)} | "
                   f"{s['median_thread_s'] * 1e3:.0f} ms | {best or 'none'} | "
                   f"{s['fastest_fixed_thread_s'] * 1e3 if best else 0:.0f} ms | {ratio} | "
                   f"{'yes' if s['losses_equal_off'] else 'NO'} |")
    ran = [s for s in d["sweep"] if "error" not in s]
    if not d["sweep"]:
        return out[:4] + [f"Full's measured peak ({_mib(fixed['full']['peak_bytes'])}) is within 0.5% of off's "
                          f"({_mib(fixed['off']['peak_bytes'])}): checkpointing does not lower this step's peak, so "
                          "no target was run."]
    if not ran:
        return out + ["", "Every target was below the predicted floor."]
    over = sum(s["measured_bytes"] > s["target_bytes"] for s in ran)
    worst = max(abs(s["prediction_error"]) for s in ran)
    below = len(d["sweep"]) - len(ran)
    steps = ""
    if all("steps_over_target" in s for s in ran):
        steps = (f", {sum(s['steps_over_target'] for s in ran)} of {sum(len(s['steps']) for s in ran)} steps "
                 "(every step, the first included)")
    out += ["", f"{over} of {len(ran)} targets run measured over the target{steps} ({below} below the predicted floor, "
            f"refused); slack {100 * min(s['slack'] for s in ran):.1f}–{100 * max(s['slack'] for s in ran):.1f}%; "
            f"largest prediction error {100 * worst:.2f}% of the measured peak."]
    timed = [s["median_thread_s"] / s["fastest_fixed_thread_s"] for s in ran if s["fastest_fixed"]]
    if timed:
        out[-1] += (f" Step time against the fastest fitting fixed mode: {min(timed):.2f}–{max(timed):.2f}×; at most "
                    f"1.00× at {sum(t <= 1.0 for t in timed)} of {len(timed)} targets, at least 10% faster at "
                    f"{sum(t <= 0.9 for t in timed)}.")
    return out
