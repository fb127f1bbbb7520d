"""docs/results.md "Bring your own policy: per-op cost": section policy_fn_overhead (the tables) and
policy_fn_overhead_reading (what they say), from bench/results/policy_fn_overhead.json (bench/peers/policy_fn_overhead.py)."""
from bench.common.report import load, tunables


POLICY_FN_VARIANTS = {
    "off": "no checkpoint",
    "full": "checkpoint, no policy",
    "torch_sac_fn": "torch's SAC, `policy_fn`",
    "hpac_fn": "hpac, `policy_fn`",
    "torch_sac_list": "torch's SAC, `[aten.mm.default]`",
    "hpac_list": "hpac, `[aten.mm.default]` (C++ save list)",
    "hpac_selective": "hpac, `context_fn(\"selective\")`",
    "full_flop": "checkpoint, no policy; FlopCounterMode around backward",
    "torch_sac_fn_flop": "torch's SAC, `policy_fn`; FlopCounterMode around backward",
    "hpac_fn_flop": "hpac, `policy_fn`; FlopCounterMode around backward",
}


def policy_fn_overhead(r):
    """docs/results.md "Bring your own policy: per-op cost" (bench/peers/policy_fn_overhead.py)."""
    d = load(r, "policy_fn_overhead.json")
    o, g = d["ops"], d["region"]
    out = [f"torch {d['torch']}, {d['threads']} thread(s), key {d['hpac_dispatch_key']}, "
           f"GLIBC_TUNABLES={tunables(d)}; {g['iters']} × `{g['body']}` on {g['shape'][0]}×{g['shape'][1]} "
           f"{g['dtype']}: {o['forward']} ops in the forward, {o['recompute']} rerun by the recompute; {d['reps']} "
           f"repetitions × {d['inner']} runs (fastest of the {d['inner']} per phase), variants interleaved", "",
           "| variant | forward µs/op | extra over off | recompute µs/op | extra over full¹ | backward − off's "
           "backward, µs/op | policy_fn asked per call (forward / recompute) | grads bitwise = off |",
           "|---|---:|---:|---:|---:|---:|---:|---|"]
    for v, x in d["per_op"].items():
        asked = d["policy_asked_per_call"].get(v)
        asked = f"{asked['forward']:g} / {asked['recompute']:g}" if asked else ""
        rec = (f"{x['recompute_us_per_op']:.2f} | {x['recompute_extra_over_full_us_per_op']:+.2f}"
               if "recompute_us_per_op" in x else "— | —")
        out.append(f"| {POLICY_FN_VARIANTS.get(v, v)} | {x['forward_us_per_op']:.2f} | "
                   f"{x['forward_extra_over_off_us_per_op']:+.2f} | {rec} | "
                   f"{x['backward_extra_over_off_us_per_op']:+.2f} | {asked} | {d['grads_bitwise_equal_off'][v]} |")
    out += ["", "¹ the FlopCounterMode rows: over the same row's baseline with the counter (checkpoint, no policy; "
            "FlopCounterMode around backward).", "",
            "| hpac / torch's SAC, median of per-repetition ratios [min, max] | forward | recompute | backward |",
            "|---|---:|---:|---:|"]
    for k, x in d["ratios"].items():
        h, t = k.split("/")
        out.append(f"| {POLICY_FN_VARIANTS.get(h, h)} / {POLICY_FN_VARIANTS.get(t, t)} | " + " | ".join(
            f"{x[ph]['median']:.3f} [{x[ph]['min']:.2f}, {x[ph]['max']:.2f}]"
            for ph in ("forward", "recompute", "backward")) + " |")
    flops = d["flops_in_backward"]
    out += ["", f"Sanity: `policy_fn` asked the same number of times under both: {d['policy_asked_same_under_both']}; "
            "FLOPs the outer FlopCounterMode counted in backward: "
            + ", ".join(f"{POLICY_FN_VARIANTS.get(v, v).split(';')[0]} {n}" for v, n in flops.items()) + "."]
    return out


def policy_fn_overhead_figures(r):
    """The figures docs/results.md's reading of the tables quotes in its own prose (<!-- fig policy_fn.KEY -->)."""
    d = load(r, "policy_fn_overhead.json")
    p, q = d["per_op"], d["ratios"]
    fn, lst, flop = q["hpac_fn/torch_sac_fn"], q["hpac_list/torch_sac_list"], q["hpac_fn_flop/torch_sac_fn_flop"]
    fwd = lambda v: p[v]["forward_extra_over_off_us_per_op"]  # noqa: E731
    rec = lambda v: f"{p[v]['recompute_extra_over_full_us_per_op']:+.2f}"  # noqa: E731
    same_flops = len({d["flops_in_backward"][v] for v in ("hpac_fn_flop", "torch_sac_fn_flop")}) == 1
    return {
        "hpac_forward": f"{fwd('hpac_fn'):+.1f} µs", "sac_forward": f"{fwd('torch_sac_fn'):+.1f} µs",
        "forward_ratio": f"{fn['forward']['median']:.2f}×",
        "hpac_settle": f"{fwd('hpac_fn') - fwd('hpac_list'):.1f} µs", "sac_mode": f"{fwd('torch_sac_fn') - fwd('full'):.1f} µs",
        "hpac_recompute": f"{rec('hpac_fn')} µs", "list_recompute": rec("hpac_list"),
        "selective_recompute": rec("hpac_selective"), "sac_recompute": rec("torch_sac_fn"),
        "recompute_ratio": f"{fn['recompute']['median']:.2f}×", "backward_ratio": f"{fn['backward']['median']:.2f}×",
        "list_forward_ratio": f"{lst['forward']['median']:.2f}×", "list_recompute_ratio": f"{lst['recompute']['median']:.2f}×",
        "flop_verdict": "about what torch's SAC costs" if 0.9 <= flop["recompute"]["median"] <= 1.1 else "unlike torch's SAC",
        "flop_recompute_ratio": f"{flop['recompute']['median']:.2f}×", "flop_backward_ratio": f"{flop['backward']['median']:.2f}×",
        "hpac_flop_recompute": f"{rec('hpac_fn_flop')} µs", "sac_flop_recompute": rec("torch_sac_fn_flop"),
        "counter": f"{p['full_flop']['recompute_us_per_op'] - p['full']['recompute_us_per_op']:.1f} µs",
        "same_flops": "(equal, recorded)" if same_flops else "— NOT: the counts differ",
    }
