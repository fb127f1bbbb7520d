"""docs/results.md "Plans from run to run" (section plan_stability), from bench/results/plan_stability.json
(bench/budget/plan_stability.py)."""
from bench.common.report import load, machine


def plan_stability(r):
    """Three fresh processes per setting, their plans compared (bench/budget/plan_stability.py)."""
    d = load(r, "plan_stability.json")
    out = [f"{machine(d)}; `{d['config']}`, budget {d['budget']}, every layer its own region; estimated-pinned: HPAC_ROOFLINE "
           f"{d['pinned_roofline']} (flops and bytes per µs, what the parent process measured).", "",
           "| cost | profiles | layers whose plan is the same in every run | predicted recompute µs per run (sum over "
           "the layers) | spread | same plan or < 2 % |", "|---|---:|---:|---|---:|---|"]
    for s in d["settings"]:
        runs = " / ".join(f"{p:.0f}" for p in s["predicted_recompute_micros"])
        out.append(f"| {s['cost']} | {s['profiles']} | {s['layers_with_one_plan']} of {s['layers']} | {runs} | "
                   f"{100 * s['spread']:.1f} % | {'yes' if s['rule_met'] else 'no'} |")
    return out
