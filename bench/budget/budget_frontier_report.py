"""docs/results.md "The memory budget's frontier" (section budget_frontier): hpac's budget policy against off,
full, selective and torch.compile's activation_memory_budget, from bench/results/budget_frontier.json
(bench/budget/budget_frontier.py)."""
from bench.common.report import load, tunables


def budget_frontier(r):
    """hpac's budget policy against off, full, the fixed selective policy and torch.compile's activation_memory_budget
    (bench/budget/budget_frontier.py), per model: one row per method, then the issue's target read off the rows."""
    d = load(r, "budget_frontier.json")
    machine = (f"1-minute load average {d['load_average_at_start']:.1f} at the start, {d['load_average_at_end']:.1f} at "
            "the end" if "load_average_at_start" in d else "shared with other work: timings are noisy")
    out = [f"torch {d['torch']}, {d['threads']} threads on {d['cpus']} CPUs ({machine}), "
           f"GLIBC_TUNABLES={tunables(d)}; eager: median of {d['steps']} interleaved "
           f"steps after a warm-up; compile: median of {d['compile_steps']} steps per budget, alternated with an off "
           "model (its median beside it). Step = forward + backward; peak = tensor bytes above the step's start."]
    for name, m in d["models"].items():
        rows = m["rows"]
        off = next(x for x in rows if x["method"] == "off")
        out += ["", f"**{name}**: {m['shape']}", "",
                "| method | peak | vs off | step time (median; min–max) | vs off | grads = off | plan kept / budget; "
                "ops saved, skipped of planned (first region) |",
                "|---|---|---|---|---|---|---|"]
        for x in rows:
            off_ms = x.get("off_ms_median_alongside", off["ms_median"])
            equal = {True: "bit for bit", False: "NO"}.get(x.get("grads_bitwise_equal_off"), "-")
            plan = "-"
            if x.get("regions"):
                g = x["regions"][0]
                plan = f"{g['kept_bytes'] / 2**20:.2f} / {g['budget_bytes'] / 2**20:.2f} MiB ({g['stage']})"
                if "skipped_ops" in g:
                    plan += f"; {g['saved_ops']}, {g['skipped_ops']} of {g['planned_ops']}"
            out.append(f"| {x['method']} | {x['peak_bytes'] / 2**20:.1f} MiB | {x['peak_bytes'] / off['peak_bytes']:.2f}x "
                       f"| {x['ms_median']:.0f} ms; {min(x['ms_all']):.0f}–{max(x['ms_all']):.0f} | {x['ms_median'] / off_ms:.2f}x "
                       f"| {equal} | {plan} |")
        t = m["against_target"]
        by = {x["method"]: x for x in rows}
        goal = t["target"]

        def judged(a, b):
            """Whether method a's steps were all faster than all of b's (else the medians are within the noise)."""
            return max(by[a]["ms_all"]) < min(by[b]["ms_all"])

        sel = t["at_selective_memory"]
        if sel.get("budget") is not None:
            a = f"budget:{sel['budget']}"
            verdict = ("met" if sel["faster"] >= goal["faster_at_selective_memory"] else "missed") \
                if judged(a, "selective") else "not judged: the two step-time ranges overlap (noise)"
            out.append(f"- At selective's peak or less ({sel['peak_vs_selective']:.2f}x of it): budget {sel['budget']}'s "
                       f"median step is {100 * abs(sel['faster']):.1f} % {'below' if sel['faster'] >= 0 else 'above'} "
                       f"selective's (target ≥ "
                       f"{100 * goal['faster_at_selective_memory']:.0f} %): {verdict}.")
        else:
            out.append(f"- No budget point is at or below selective's peak (the smallest is "
                       f"{sel['least_budget_peak_vs_selective']:.2f}x of it): target missed.")
        full = t["at_full_time"]
        least = min((x for x in rows if x["family"] == "budget"), key=lambda x: x["peak_bytes"])
        out.append(f"- Least budget peak: {least['peak_bytes'] / by['full']['peak_bytes']:.2f}x of full's (budget "
                   f"{least['budget']}); at full's median step time or less: " +
                   (f"budget {full['budget']}, {100 * abs(full['less_memory']):.1f} % "
                    f"{'less' if full['less_memory'] >= 0 else 'more'} peak than full (target ≥ "
                    f"{100 * goal['less_memory_at_full_time']:.0f} %: "
                    f"{'met' if full['less_memory'] >= goal['less_memory_at_full_time'] else 'missed'})."
                    if full.get("budget") is not None else "no budget point (target missed)."))
        # The reverse reading of the second target: full keeps the least any recompute-only plan can (budget 0 is
        # full), so compare times at full's memory instead.
        at_full_memory = [x for x in rows if x["family"] == "budget" and x["peak_bytes"] <= by["full"]["peak_bytes"]]
        if at_full_memory:
            best = min(at_full_memory, key=lambda x: x["ms_median"])
            gain = 1 - best['ms_median'] / by['full']['ms_median']
            out.append(f"- At full's peak or less: budget {best['budget']}'s median step is "
                       f"{100 * abs(gain):.1f} % {'below' if gain >= 0 else 'above'} full's"
                       + ("" if judged(f"budget:{best['budget']}", "full") else
                          " (the step-time ranges overlap: within the noise)") + ".")
    return out
