"""docs/results.md "At Qwen3-30B-A3B's layer shapes" (bench/scale/frontier_30b.py): section frontier_30b from
bench/results/frontier_30b.json, section frontier_30b_context_fn from bench/results/frontier_30b_context_fn.json."""
from bench.common.report import load, tunables


def frontier_30b(r, name="frontier_30b.json"):
    """The frontier at Qwen3-30B-A3B's layer shapes (bench/scale/frontier_30b.py): one table per (seq, dtype), then the
    targets read off the rows."""
    d = load(r, name)
    out = [f"torch {d['torch']}, {d['threads']} threads on {d['cpus']} CPUs (1-minute load average "
           f"{d['load_average_at_start']:.1f} at the start, {d['load_average_at_end']:.1f} at the end), "
           f"GLIBC_TUNABLES={tunables(d)}; median of {d['steps']} interleaved steps after a "
           "warm-up (compile: its own steps alternated with off's). Step = forward + backward; peak = tensor bytes "
           "above the step's start; kept = what the forward left for backward."]
    for name, m in d["models"].items():
        rows = [x for x in m["rows"] if "error" not in x]
        off = next(x for x in rows if x["method"] == "off")
        out += ["", f"**{name}**: {m['shape']}", "",
                "| method | peak | vs off | kept after forward | vs off | step time (median; min–max) | vs off | "
                "max abs dgrad vs off's first step |", "|---|---|---|---|---|---|---|---|"]
        for x in rows:
            off_ms = x.get("off_ms_median_alongside", off["ms_median"])
            equal = f"{x['max_dgrad_vs_off']:.1e}"
            out.append(f"| {x['method']} | {x['peak_bytes'] / 2**20:.0f} MiB | {x['peak_bytes'] / off['peak_bytes']:.2f}x "
                       f"| {x['kept_bytes'] / 2**20:.1f} MiB | {x['kept_bytes'] / off['kept_bytes']:.2f}x | "
                       f"{x['ms_median']:.0f} ms; {min(x['ms_all']):.0f}–{max(x['ms_all']):.0f} | "
                       f"{x['ms_median'] / off_ms:.2f}x | {equal} |")
        for x in m["rows"]:
            if "error" in x:
                out.append(f"| {x['method']} | not measured: {x['error']} | | | | | | |")
        t = m["against_target"]
        for memory, what in (("peak_bytes", "peak"), ("kept_bytes", "kept bytes")):
            if f"at_selective_{memory}" not in t:
                continue  # no selective row in this run
            a = t[f"at_selective_{memory}"]
            if a is None:
                out.append(f"- At selective's {what} or less: no budget point; target (≥ 15 % faster) missed.")
                continue
            verdict = ("met" if a["faster_than_selective"] >= a["target"] else "missed") if a["ranges_apart"] else \
                "not judged: the step-time ranges overlap"
            out.append(f"- At selective's {what} or less: budget {a['budget']}'s median step is "
                       f"{100 * abs(a['faster_than_selective']):.1f} % "
                       f"{'below' if a['faster_than_selective'] >= 0 else 'above'} selective's (target ≥ "
                       f"{100 * a['target']:.0f} %): {verdict}.")
        for key, what in (("budget_1_vs_off", "Budget 1.0 (hpac's frame)"),
                          ("context_fn_1_vs_off", "Budget 1.0 under torch.utils.checkpoint's frame")):
            one = t.get(key)
            if one:
                verdict = "met" if one["time_ratio"] <= one["target"] else "missed"
                out.append(f"- {what}: {one['time_ratio']:.3f}x off's median step (target ≤ {one['target']:.2f}x): "
                           f"{verdict}" + ("; the two ranges overlap" if one["ranges_overlap"] else "") + ".")
    return out


def frontier_30b_context_fn(r):
    """frontier_30b's tables for the run with context_fn methods (python -m bench.scale.frontier_30b --methods
    off,budget:1.0,context_fn:1.0,full --out bench/results/frontier_30b_context_fn.json)."""
    return frontier_30b(r, "frontier_30b_context_fn.json")
