"""docs/results.md "Bring your own policy: per-op cost": sections policy_fn_overhead (the tables) and
policy_fn_overhead_reading (what they say), from bench/results/policy_fn_overhead.json (bench/policy_fn_overhead.py)."""
from report_common import load


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
    """docs/results.md "Bring your own policy: per-op cost" (bench/policy_fn_overhead.py)."""
    d = load(r, "policy_fn_overhead.json")
    o, g = d["ops"], d["region"]
    out = [f"torch {d['torch']}, {d['threads']} thread(s), key {d['hpac_dispatch_key']}, "
           f"GLIBC_TUNABLES={d['glibc_tunables']}; {g['iters']} × `{g['body']}` on {g['shape'][0]}×{g['shape'][1]} "
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


def policy_fn_overhead_reading(r):
    d = load(r, "policy_fn_overhead.json")
    p, q = d["per_op"], d["ratios"]
    fn, lst, flop = q["hpac_fn/torch_sac_fn"], q["hpac_list/torch_sac_list"], q["hpac_fn_flop/torch_sac_fn_flop"]
    ours = p["hpac_fn"]["forward_extra_over_off_us_per_op"] - p["hpac_list"]["forward_extra_over_off_us_per_op"]
    theirs = p["torch_sac_fn"]["forward_extra_over_off_us_per_op"] - p["full"]["forward_extra_over_off_us_per_op"]
    return [
        "Reading it:",
        f"- Forward: a Python `policy_fn` costs hpac {p['hpac_fn']['forward_extra_over_off_us_per_op']:+.1f} µs per op "
        f"over no checkpoint and torch's SAC {p['torch_sac_fn']['forward_extra_over_off_us_per_op']:+.1f} µs "
        f"(hpac/torch {fn['forward']['median']:.2f}× per repetition): both run a Python dispatch mode per op, "
        f"hpac's asks the function and settles its answer in C++ (about {ours:.1f} µs per op above hpac's C++ save "
        f"list; torch's mode, {theirs:.1f} µs above a checkpoint without policy).",
        f"- Recompute: hpac replays the answers in C++ without asking the function, but under a pass-through Python "
        f"mode that keeps torch's composite ops decomposing as in the forward (Note [One mode state in both phases]): "
        f"{p['hpac_fn']['recompute_extra_over_full_us_per_op']:+.2f} µs per op over a full checkpoint's recompute, "
        f"where its C++ list costs {p['hpac_list']['recompute_extra_over_full_us_per_op']:+.2f} and its built-in "
        f"rules {p['hpac_selective']['recompute_extra_over_full_us_per_op']:+.2f}; torch's cached mode, Python per op "
        f"too: {p['torch_sac_fn']['recompute_extra_over_full_us_per_op']:+.2f}. hpac/torch "
        f"{fn['recompute']['median']:.2f}×, backward as a whole {fn['backward']['median']:.2f}×.",
        f"- A list of ops: hpac runs it in C++ in both phases, torch's SAC turns it into a Python policy: hpac/torch "
        f"{lst['forward']['median']:.2f}× forward, {lst['recompute']['median']:.2f}× recompute.",
        f"- With a FlopCounterMode around backward, hpac's recompute pushes its innermost Python mode and then costs "
        + ("about what torch's SAC costs" if 0.9 <= flop["recompute"]["median"] <= 1.1 else "unlike torch's SAC")
        + f" (hpac/torch {flop['recompute']['median']:.2f}× recompute, "
        f"{flop['backward']['median']:.2f}× backward): one Python mode per op in both. Over a full checkpoint's "
        f"recompute under the same counter: hpac {p['hpac_fn_flop']['recompute_extra_over_full_us_per_op']:+.2f} µs "
        f"per op, torch's SAC {p['torch_sac_fn_flop']['recompute_extra_over_full_us_per_op']:+.2f} (the ops either "
        f"serves never reach the counter). The counter alone adds "
        f"{p['full_flop']['recompute_us_per_op'] - p['full']['recompute_us_per_op']:.1f} µs per op to a full "
        "recompute (difference of medians); both count the same FLOPs "
        + ("(equal, recorded)." if len(set(d["flops_in_backward"][v] for v in ("hpac_fn_flop", "torch_sac_fn_flop")))
           == 1 else "— NOT: the counts differ."),
    ]
