"""docs/results.md "torchtitan's selective checkpointing, run by hpac" (section torchtitan_sac), from
bench/results/torchtitan_sac.json (bench/peers/torchtitan_sac.py)."""
from bench.common.report import load, tunables


TORCHTITAN_VARIANTS = {
    "off": "no activation checkpointing",
    "torchtitan": "torchtitan's `SelectiveAC` (its policy_fn through torch's SAC)",
    "hpac_torchtitan": "`hpac.torchtitan.apply_ac` (the rules as hpac's C++ kind `torchtitan`)",
    "hpac_policy_fn": "torchtitan's `SelectiveAC`, its policy_fn through hpac",
    "hpac_selective": "hpac's built-in `selective`",
    "hpac_budget": "hpac's eager budget 0.5",
}


def torchtitan_sac(r):
    """docs/results.md "torchtitan's selective checkpointing, run by hpac" (bench/peers/torchtitan_sac.py)."""
    d = load(r, "torchtitan_sac.json")
    m = d["model"]
    out = [f"torch {d['torch']}, torchtitan {d['torchtitan']}, {d['threads']} thread(s), key {d['hpac_dispatch_key']}, "
           f"GLIBC_TUNABLES={tunables(d)}; {m['name']}: {m['layers']} layers, {m['experts']} experts top-"
           f"{m['top_k']}, dim {m['dim']}, {m['params'] / 1e6:.1f} M parameters, {m['attention']}; batch {d['batch']} × "
           f"seq {d['seq']}; {d['steps']} steps after {d['warmup']} warm-up, variants interleaved (order rotated per "
           "step); medians over steps, ratios paired per step", "",
           "| variant | kept after forward MiB | kept / off | peak MiB | peak / off | step ms | time / off | "
           "time / torchtitan | max \\|grad − off\\| | bitwise = off |",
           "|---|---:|---:|---:|---:|---:|---:|---:|---:|---|"]
    for v, x in d["summary"].items():
        out.append(f"| {TORCHTITAN_VARIANTS.get(v, v)} | {x['kept_bytes'] / 2**20:.2f} | {x['kept_vs_off']:.3f} | "
                   f"{x['peak_bytes'] / 2**20:.2f} | {x['peak_vs_off']:.3f} | {x['step_seconds'] * 1e3:.1f} | "
                   f"{x['time_vs_off']:.2f} | {x['time_vs_torchtitan']:.2f} | {x['max_grad_diff']:.3g} | "
                   f"{x['grads_bitwise_equal_off']} |")
    return out
