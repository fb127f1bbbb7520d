"""docs/results.md "The budget's frontier on the main job" (section main_job_frontier), from
bench/results/main_job_frontier.json (bench/budget/main_job_frontier.py)."""
from bench.common.report import load, span, tunables


def main_job_frontier(r):
    """docs/results.md "The budget's frontier on the main job" (bench/budget/main_job_frontier.py)."""
    d = load(r, "main_job_frontier.json")
    m = d["model"]
    rows = d["rows"]
    out = [f"torch {d['torch']}, {d['threads']} thread on {d['cpus']} CPUs (1-minute load average "
           f"{d['load_average_at_end']:.1f} at the end), {d['clock']}, GLIBC_TUNABLES={tunables(d)}; "
           f"`{d['config']}` ({m['layers']} layers, hidden {m['hidden']}, {m['experts']} experts top-{m['top_k']}, seq "
           f"{m['seq']} x batch {m['batch']}), every layer its own checkpoint under hpac's frame; {d['steps']} "
           f"interleaved rounds after a warm-up, medians; plans from the median of {d['profiles']} profiles. Step = "
           "forward + backward; peak = tensor bytes above the step's start.", "",
           "| method | peak MiB | peak vs off | step ms (median; min–max) | step vs off | the frontier's step at this "
           "peak | vs the frontier | predicted recompute µs: hpac's objective / kernels only | grads = off |",
           "|---|---:|---:|---|---:|---:|---:|---|---|"]
    for name, x in rows.items():
        frontier = (f"{x['frontier_step_ms']:.1f} ms | {x['vs_frontier']:.2f}x "
                    f"({'on or beyond' if x['on_or_beyond'] else 'inside'})" if "frontier_step_ms" in x else "- | -")
        predicted = (f"{x['recompute_micros']:.0f} / {x['dataflow_micros']:.0f}" if "recompute_micros" in x
                     else f"- / {x['dataflow_micros']:.0f}" if "dataflow_micros" in x else "-")
        label = name.replace("hpac:", "budget ").replace("optimum:", "MILP optimum, budget ")
        out.append(f"| {label} | {x['peak_bytes'] / 2**20:.2f} | {x['peak_vs_off']:.2f}x | {x['step_ms']:.1f}; "
                   f"{span(x['step_ms_all'], '{:.0f}')} | {x['step_vs_off']:.2f}x | {frontier} | {predicted} | "
                   f"{'bit for bit' if x['grads_bitwise_equal_off'] else 'DIFFERS'} |")
    budgets = [k for k in rows if k.startswith("hpac:")]
    beyond = [k for k in budgets if rows[k]["on_or_beyond"]]
    target = [k for k in rows if k not in ("off", "full", "selective") and rows[k]["peak_vs_off"] <= 0.6]
    best = min(target, key=lambda k: rows[k]["step_vs_off"]) if target else None
    out += ["", f"- hpac's budget points on or beyond the frontier: {len(beyond)} of {len(budgets)}"
            + (f" ({', '.join(k.split(':')[1] for k in beyond)})" if beyond else "") + "; worst "
            f"{max(rows[k]['vs_frontier'] for k in budgets):.2f}x the frontier's step."]
    if best:
        out.append(f"- With at least 40 % less peak than off: the fastest point is {best.replace(':', ' ')} at "
                   f"{rows[best]['peak_vs_off']:.2f}x off's peak and {rows[best]['step_vs_off']:.2f}x off's step "
                   "(target 1.15x).")
    return out
