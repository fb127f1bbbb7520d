"""The figures of docs/*.md, from the suite's JSON (bench/results/*.json).

Every table and every sentence that quotes a measured figure sits in a generated region of a document:

    <!-- BEGIN generated NAME -->
    ...                            (replaced by section NAME below)
    <!-- END generated NAME -->

    .venv/bin/python bench/report_results.py                 # prints every section
    .venv/bin/python bench/report_results.py --write docs/*.md  # rewrites the regions in place
    .venv/bin/python bench/report_results.py --check docs/*.md  # CTest docs.figures_match_json

--check fails when a region differs from what the JSON gives, names a section that does not exist, or when a figure
(a ratio such as 1.5×, a percentage, or a quantity in ms, ns or MiB) stands outside the generated regions. Figures
that are not this project's measurements (a reference design's table) sit between
<!-- BEGIN quoted WHY --> and <!-- END quoted -->, which says where they come from.
Only the Python standard library: any python3 runs it.
"""
import argparse
import json
import os
import re
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def load(results, name):
    with open(os.path.join(results, name)) as f:
        return json.load(f)


def rows(data, pattern):
    out = []
    for b in data["benchmarks"]:
        m = re.match(pattern, b["name"])
        if m and b.get("run_type") != "aggregate":
            out.append((m, b))
    return out


def span(values, fmt="{:.2f}"):
    lo, hi = fmt.format(min(values)), fmt.format(max(values))
    return lo if lo == hi else f"{lo}–{hi}"


STEP = r"BM_Step/seq:(\d+)/layers:(\d+)"
TRAIN = r"BM_TrainStep/model:(\d+)/seq:(\d+)/layers:(\d+)"


def overhead_medians(d):
    return {b["name"].replace("_median", ""): b["ns_per_op"] for b in d["benchmarks"] if b["name"].endswith("_median")}


def overhead(r):
    med = overhead_medians(load(r, "overhead.json"))
    a = med["BM_Add_NotLoaded"]
    out = ["| variant | ns/op (median of 7) | vs (a) |", "|---|---:|---:|"]
    for key, label in [("BM_Add_NotLoaded", "(a) hpac not loaded"), ("BM_Add_LoadedNoRegion", "(b) loaded, no region"),
                       ("BM_Add_RegionForward", "(c) in a region, forward"),
                       ("BM_Add_RegionServe", "(d) in a region, recompute, served")]:
        out.append(f"| {label} | {med[key]:.0f} | {med[key] / a:.3f} ({med[key] - a:+.0f} ns) |")
    return out


def step_table(d, pattern, label):
    out = [f"| {label} | off ms | full ms | selective ms | full/off time | sel/off time | off peak MiB | full peak MiB "
           "| sel peak MiB | full/off peak | sel/off peak | sel served | sel recomputed |",
           "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for m, b in rows(d, pattern):
        out.append(f"| {m.group(0).split('/', 1)[1]} | {b['off_ms']:.1f} | {b['full_ms']:.1f} | {b['selective_ms']:.1f} | "
                   f"{b['full_vs_off_time']:.2f} | {b['selective_vs_off_time']:.2f} | {b['off_peak_MiB']:.1f} | "
                   f"{b['full_peak_MiB']:.1f} | {b['selective_peak_MiB']:.1f} | {b['full_vs_off_peak']:.2f} | "
                   f"{b['selective_vs_off_peak']:.2f} | {b['selective_served']:.0f} | {b['selective_recomputed']:.0f} |")
    return out


def step(r):
    return step_table(load(r, "step.json"), STEP, "seq / layers")


def train_step(r):
    return step_table(load(r, "train_step.json"), TRAIN, "model / seq / layers")


def peer(r):
    d = load(r, "peer.json")
    out = [f"torch {d['torch']}, {d['threads']} thread(s), GLIBC_TUNABLES={d['glibc_tunables']}", "",
           "| seq | off ms | torch_full ms | py_sac ms | hpac ms | off peak MiB | torch_full | py_sac | hpac | "
           "hpac/py_sac time | hpac/torch_full time | hpac/off time |",
           "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for x in d["results"]:
        out.append(f"| {x['seq']} | {x['off']['ms']:.1f} | {x['torch_full']['ms']:.1f} | {x['py_sac']['ms']:.1f} | "
                   f"{x['hpac']['ms']:.1f} | {x['off']['peak_MiB']:.1f} | {x['torch_full']['peak_MiB']:.1f} | "
                   f"{x['py_sac']['peak_MiB']:.1f} | {x['hpac']['peak_MiB']:.1f} | {x['hpac_vs_py_sac_time']:.3f} | "
                   f"{x['hpac_vs_torch_full_time']:.3f} | {x['hpac_vs_off_time']:.3f} |")
    return out


def sac_peer(r):
    d = load(r, "sac_peer.json")
    mib = 2 ** 20
    out = [f"torch {d['torch']}, {d['threads']} thread(s), key {d['hpac_dispatch_key']}, "
           f"GLIBC_TUNABLES={d['glibc_tunables']}", "",
           "| attention | seq | reps | off ms | hpac ms | PyTorch SAC ms | hpac/SAC time, median of per-rep ratios "
           "[min, max] |", "|---|---:|---:|---:|---:|---:|---:|"]
    for x in d["steps"]:
        t = x["time_ratio_hpac_over_pytorch_sac"]
        out.append(f"| {x['attention']} | {x['seq']} | {x['reps']} | {x['off']['ms_median']:.1f} | "
                   f"{x['hpac']['ms_median']:.1f} | {x['pytorch_sac']['ms_median']:.1f} | "
                   f"{t['median']:.3f} [{t['min']:.2f}, {t['max']:.2f}] |")
    out += ["", "| attention | seq | off peak MiB | hpac peak | SAC peak | off kept MiB | hpac kept | SAC kept | "
            "grads bitwise = off (hpac, SAC) |", "|---|---:|---:|---:|---:|---:|---:|---:|---|"]
    for x in d["steps"]:
        o, h, p = x["off"], x["hpac"], x["pytorch_sac"]
        out.append(f"| {x['attention']} | {x['seq']} | {o['peak_bytes'] / mib:.2f} | {h['peak_bytes'] / mib:.2f} | "
                   f"{p['peak_bytes'] / mib:.2f} | {o['kept_bytes'] / mib:.2f} | {h['kept_bytes'] / mib:.2f} | "
                   f"{p['kept_bytes'] / mib:.2f} | {h['grads_bitwise_equal_off']}, {p['grads_bitwise_equal_off']} |")
    per_op = d["per_op"]
    out += ["", f"| per op: {per_op['ops_per_round']} × {per_op['op']}, {per_op['rounds']} rounds | median ns/op | "
            "extra over plain |", "|---|---:|---:|"]
    for k, v in per_op["ns_per_op_median"].items():
        extra = per_op["extra_ns_per_op_over_plain"].get(k)
        out.append(f"| {k} | {v:.0f} | {'' if extra is None else f'{extra:+.0f}'} |")
    return out


def sac_peer_reading(r):
    d = load(r, "sac_peer.json")
    mib = 2 ** 20
    steps = d["steps"]
    same = all(x["hpac"]["peak_bytes"] == x["pytorch_sac"]["peak_bytes"] and
               x["hpac"]["kept_bytes"] == x["pytorch_sac"]["kept_bytes"] for x in steps)
    bitwise = all(x["hpac"]["grads_bitwise_equal_off"] and x["pytorch_sac"]["grads_bitwise_equal_off"] for x in steps)
    extra = d["per_op"]["extra_ns_per_op_over_plain"]
    small = [x["time_ratio_hpac_over_pytorch_sac"]["median"] for x in steps if x["seq"] == min(s["seq"] for s in steps)]
    large = [x["time_ratio_hpac_over_pytorch_sac"]["median"] for x in steps if x["seq"] >= 512]
    worst = max(steps, key=lambda x: x["time_ratio_hpac_over_pytorch_sac"]["max"])
    longest = max(s["seq"] for s in steps)
    kept = {x["attention"]: x["hpac"]["kept_bytes"] / mib for x in steps if x["seq"] == longest}
    first = ("- Same policy, same memory: the two implementations keep exactly the same tensors (peak and kept equal "
             "to the byte in every row, also asserted by `test_peer_sac.py` within 2%)" if same else
             "- Peak or kept memory differ between the two implementations in some rows")
    first += (", and every gradient is bitwise equal to off's. Only time differs." if bitwise else
              "; NOT every gradient is bitwise equal to off's.")
    return [
        "Reading it:",
        first,
        f"- hpac's advantage is per op (a C++ fallback against Python dispatch modes: {extra['hpac_region']:+.0f} ns "
        f"against {extra['pytorch_sac_caching_mode']:+.0f} ns per small op, "
        f"{extra['pytorch_sac_caching_mode'] / extra['hpac_region']:.0f}×; a do-nothing Python mode alone costs "
        f"{extra['python_noop_mode']:+.0f} ns), so it is largest where ops are small (seq {min(s['seq'] for s in steps)}: "
        f"{span(small, '{:.2f}')}×) and shrinks as kernels grow (seq 512–{longest}: {span(large, '{:.2f}')}×). The "
        f"per-rep ratios spread widely (up to {worst['time_ratio_hpac_over_pytorch_sac']['max']:.2f} at seq "
        f"{worst['seq']} {worst['attention']}) on this shared 2-core machine; treat differences below ~0.1 as noise.",
        f"- An op served from hpac's cache costs about what the plain op costs ({extra['hpac_serve']:+.0f} ns): serving "
        "skips the kernel.",
        f"- Eager attention keeps the S×S scores (`bmm` is in the save set): {kept['eager']:.1f} MiB kept at seq "
        f"{longest} against {kept['sdpa']:.1f} MiB with SDPA, whose CPU kernel saves B·H·S·D outputs and the "
        "log-sum-exp.",
    ]


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


def key_ratios(r):
    med = overhead_medians(load(r, "overhead.json"))
    a, b, c, dd = (med[k] for k in ("BM_Add_NotLoaded", "BM_Add_LoadedNoRegion", "BM_Add_RegionForward",
                                     "BM_Add_RegionServe"))
    block = {(int(m.group(1)), int(m.group(2))): x for m, x in rows(load(r, "step.json"), STEP)}
    train = {(int(m.group(1)), int(m.group(2)), int(m.group(3))): x for m, x in rows(load(r, "train_step.json"), TRAIN)}
    bk, tk = block[(1024, 4)], train[(0, 1024, 4)]
    p = load(r, "peer.json")["results"]
    same = all(x["hpac"]["peak_MiB"] == x["py_sac"]["peak_MiB"] and x["hpac"]["kept_MiB"] == x["py_sac"]["kept_MiB"]
               for x in p)
    return [
        f"- **Per-op cost**: loaded but outside regions {b - a:+.0f} ns ({(b / a - 1) * 100:.1f} %); inside a region "
        f"{c - a:+.0f} ns per op; an op served from cache costs {abs(dd - a):.0f} ns "
        f"{'less' if dd < a else 'more'} than running the kernel. From Python the per-op costs are measured on torch "
        "2.13 in the last section (`bench/sac_peer.py`, `sac_peer.json`).",
        f"- **Selective vs off** (block benchmark, 4 layers, seq 1024): peak {bk['selective_vs_off_peak']:.2f}×, step "
        f"time {bk['selective_vs_off_time']:.2f}×. On the trainer's Qwen3-MoE tiny (AdamW, 4 layers, seq 1024): peak "
        f"{tk['selective_vs_off_peak']:.2f}×, time {tk['selective_vs_off_time']:.2f}×.",
        f"- **Full vs off** (same): peak {bk['full_vs_off_peak']:.2f}× (trainer: {tk['full_vs_off_peak']:.2f}×), time "
        f"{bk['full_vs_off_time']:.2f}× (trainer: {tk['full_vs_off_time']:.2f}×).",
        "- **hpac vs the Python-mode SAC** with the same policy (peer harness): " +
        ("identical peak and kept memory (the same policy keeps the same tensors)" if same else
         "peak or kept memory differ in some rows") +
        f", step time {span([x['hpac_vs_py_sac_time'] for x in p], '{:.3f}')}×; vs `torch.utils.checkpoint` full: "
        f"{span([x['hpac_vs_torch_full_time'] for x in p])}× the time at "
        f"{span([x['hpac']['peak_MiB'] / x['torch_full']['peak_MiB'] for x in p])}× its peak (selective keeps the "
        "saved outputs).",
    ]


def scale(r):
    all_rows = [x for _, x in rows(load(r, "step.json"), STEP)] + [x for _, x in rows(load(r, "train_step.json"), TRAIN)]
    full_peak = [x["full_vs_off_peak"] for x in all_rows]
    sel_peak = [x["selective_vs_off_peak"] for x in all_rows]
    times = [x["full_vs_off_time"] for x in all_rows] + [x["selective_vs_off_time"] for x in all_rows]
    faster = sum(1 for x in all_rows if x["selective_ms"] < x["full_ms"])
    return [
        "- **Scale and device**: tiny replicas (hidden 64–128, 2–8 layers) in fp32 on 2 CPU cores, not the 30B model in "
        "bf16 on accelerators. Parameters and optimizer state are a small share of memory here, so activation savings "
        f"show as much larger ratios (full keeps {span([100 * v for v in full_peak], '{:.0f}')} % of off's peak over "
        "the block and trainer tables).",
        "- **Attention**: torch 1.13 has no fused SDPA. Eager attention's `q @ kᵀ` arrives as `bmm`, which is in the "
        "save set, so selective keeps the S×S attention scores; they dominate activation memory at long sequences, "
        f"which is why selective saves much less than full here ({span(sel_peak)}× of off vs {span(full_peak)}×). The "
        "reference table was measured with fused attention kernels whose saved outputs are B·H·S·D.",
        "- **Time**: on CPU the recomputed elementwise ops (norms, softmax, routing, activations) cost about as much as "
        f"the matmuls at these sizes, so checkpointing costs {span(times)}× step time, more than on accelerators. "
        f"Selective is faster than full in {faster} of the {len(all_rows)} rows (it skips the saved matmuls and "
        "attention products) and slower in the others; the "
        "reference has selective slower than full.",
    ]


DIST_NOTES = {"tp2": " (2 all-reduces × 4 layers)", "ep2_dp2": " (send+recv of counts, dispatch, combine × 4 layers)"}


def distributed(r):
    d = load(r, "distributed.json")
    out = ["| layout | ranks | max \\|dloss\\| | max \\|dgrad\\| | collectives per step and rank 0, forward / recompute "
           "region (full; selective) | FSDP gathers (selective) | rank 0 peak off → full / selective |",
           "|---|---|---|---|---|---|---|"]
    for x in d["layouts"]:
        p = x["parity_vs_1_rank"]
        dloss = max(v["max_dloss"] for v in p.values())
        dgrad = max(v["max_dgrad"] for v in p.values())
        r0 = x["per_rank"][0]
        cf, cs, g = r0["collectives_full"], r0["collectives_selective"], r0["gathers_selective"]
        gathers = f"{g[0]}/{g[1]}" if g[0] or g[1] else "–"
        out.append(f"| {x['layout']} | {x['ranks']} | {dloss:.2g} | {dgrad:.2g} | {cf[0]}/{cf[1]}; {cs[0]}/{cs[1]}"
                   f"{DIST_NOTES.get(x['layout'], '')} | {gathers} | {r0['peak_off_MiB']:.2f} → "
                   f"{r0['peak_full_MiB']:.2f} / {r0['peak_selective_MiB']:.2f} MiB |")
    return out


def hf_scale(r):
    """Real Qwen3-30B-A3B layer shapes through hpac.hf (bench/hf_qwen3_30b_layer.py)."""
    d = load(r, "hf_qwen3_30b_layer.json")
    a, m = d["args"], d["model"]
    by = {row["mode"]: row for row in d["rows"]}
    out = [f"{a['layers']} decoder layer(s), seq {a['seq']} x batch {a['batch']}, bfloat16, vocab {a['vocab']}, "
           f"{a['steps']} AdamW steps, torch {d['torch']}, transformers {d['transformers']}, {d['threads']} threads", "",
           "| mode | route | peak above step start | vs off | kept after forward | vs off | step time | vs off | "
           "max abs dloss |",
           "|---|---|---|---|---|---|---|---|---|"]
    for row in d["rows"]:
        out.append(f"| {row['mode']} | {row['route']} ({row['wrapped']}) | {row['peak_bytes'] / 2**20:.0f} MiB | "
                   f"{row['peak_vs_off']:.2f}x | {row['kept_after_forward_bytes'] / 2**20:.0f} MiB | "
                   f"{row['kept_vs_off']:.2f}x | {row['step_time_s']:.1f} s | {row['time_vs_off']:.2f}x | "
                   f"{row['max_dloss_vs_off']:.3g} |")
    expert_grad = m["num_experts"] * 2 * m["moe_intermediate_size"] * m["hidden_size"] * 2
    peaks = span([row["peak_vs_off"] for row in d["rows"]])
    equal = all(row["max_dloss_vs_off"] == 0 for row in d["rows"])
    off_times = span(by["off"]["step_times_s"], "{:.0f}")
    full_times = span(by["full"]["step_times_s"], "{:.0f}")
    out += ["",
            f"- **Kept activation memory** is the comparable figure: full keeps {by['full']['kept_vs_off']:.2f}× and "
            f"selective {by['selective']['kept_vs_off']:.2f}× of what off keeps after",
            "  the forward." + (" The loss of full and selective equals off's bit for bit in bfloat16." if equal else ""),
            f"- **Peak** does not move ({peaks}×): in transformers {d['transformers']} the experts are one 3-D parameter "
            "per projection, and the",
            "  backward of `gate_up_proj[expert_idx]` materialises a zero gradient of the whole parameter "
            f"({m['num_experts']} × {2 * m['moe_intermediate_size']} × {m['hidden_size']} bf16 =",
            f"  {expert_grad / 2**20:.0f} MiB) for each expert hit, so the transient gradient buffers, not activations, "
            "set the peak of one layer at",
            f"  seq {a['seq']}.",
            "- **Step time is not comparable**, neither to the seed (accelerators) nor between modes here: it was run "
            "on 2 CPU",
            f"  cores shared with other builds and a full test run (off's steps took {off_times} s, full's "
            f"{full_times} s); the ordering of the",
            f"  time column is noise. {a['layers']} layer(s), vocabulary cut to {a['vocab']} (the real 151936 adds the "
            "same embedding and head to every",
            "  mode)."]
    return out


FUNCOL_SHORT = {"_c10d_functional::all_reduce": "all_reduce", "_c10d_functional::all_to_all_single": "all_to_all"}


def _issued(counts, phase, op):
    c = counts[phase].get(op)
    return (c["issued"], c["served"]) if c else (0, 0)


def dist_torchrun(r):
    """Level1 on torchrun (bench/dist_torchrun.py): FSDP2, DTensor TP, expert parallel."""
    d = load(r, "dist_torchrun.json")
    x0 = d["layouts"][0]
    m, t = x0["model"], x0["train"]
    out = [f"torch {x0['torch']}, transformers {x0['transformers']}, Qwen3MoeForCausalLM {m['num_layers']} layers, "
           f"hidden {m['hidden_size']}, {m['num_experts']} experts top-{m['num_experts_per_tok']}, seq {t['seq_len']}, "
           f"micro-batch {t['micro_batch']} per dp rank, {t['steps']} AdamW steps; Gloo on loopback, "
           f"{d['threads_per_rank']} thread per rank on {d['cores']} cores. Maxima over every rank, mode and step.", "",
           "| layout | ranks | max \\|dloss\\| / \\|dgrad\\| vs 1 rank | full, selective vs off | rank 0 last step, "
           "selective: collectives forward → recompute issued (served) | FSDP2 gathers forward / recompute "
           "(ignored) | per-rank peak off → full / selective |",
           "|---|---|---|---|---|---|---|"]
    for x in d["layouts"]:
        modes = [mv for pr in x["per_rank"] for mv in pr["modes"].values()]
        dloss = max(mv["max_dloss_1rank"] for mv in modes)
        dgrad = max(mv["max_dgrad_1rank"] for mv in modes)
        off = max(max(mv["max_dloss_off"], mv["max_dgrad_off"]) for mv in modes)
        c = x["per_rank"][0]["modes"]["selective"]["last_step_counts"]
        cells = []
        for op, short in FUNCOL_SHORT.items():
            f, _ = _issued(c, "forward", op)
            rec, served = _issued(c, "recompute", op)
            if f:
                cells.append(f"{short} {f} → {rec} ({served})")
        gf, _ = _issued(c, "forward", "c10d::_allgather_base_")
        gr, _ = _issued(c, "recompute", "c10d::_allgather_base_")
        peaks = "; ".join(
            f"{pr['modes']['off']['peak_bytes'] / 2**20:.2f} → {pr['modes']['full']['peak_bytes'] / 2**20:.2f} / "
            f"{pr['modes']['selective']['peak_bytes'] / 2**20:.2f}" for pr in x["per_rank"])
        out.append(f"| {x['layout']} | {x['ranks']} | {dloss:.2g} / {dgrad:.2g} | "
                   f"{'bit for bit' if off == 0 else f'{off:.2g}'} | {', '.join(cells) or '–'} | "
                   f"{f'{gf} / {gr}' if gf else '–'} | {peaks} MiB |")
    return out


def dist_drift(r):
    """20 steps on 4 ranks with TP x EP x FSDP2 and every mode (bench/dist_torchrun.py --drift): per mode, the ranks'
    peaks in step 1 and over the later steps, the bytes live after the steps, the largest differences."""
    d = load(r, "dist_drift.json")
    m, t = d["model"], d["train"]
    steps = t["steps"]
    out = [f"torch {d['torch']}, transformers {d['transformers']}; `{d['command']}`: Qwen3MoeForCausalLM "
           f"{m['num_layers']} layers, hidden {m['hidden_size']}, {m['num_experts']} experts top-"
           f"{m['num_experts_per_tok']}, seq {t['seq_len']}, micro-batch {t['micro_batch']} per dp rank, {steps} "
           f"AdamW steps, modes interleaved step by step; {d['ranks']} Gloo ranks, {d['threads_per_rank']} thread "
           f"each on {d['cores']} cores ({d['wall_s']:.0f} s). Per rank, peak tensor bytes above the step's start.", "",
           "| mode | peak step 1, per rank | peak steps 2–%d, min–max over ranks and steps | tensor bytes live after "
           "step 2 → step %d, every rank (the whole process: every mode's model and optimizer, the 1-rank run) | max \\|dloss\\| / \\|dgrad\\| vs 1 rank | vs off |" % (steps, steps),
           "|---|---|---|---|---|---|"]
    for mode in d["per_rank"][0]["modes"]:
        per = [pr["modes"][mode] for pr in d["per_rank"]]
        first = " / ".join(f"{rows[0]['peak_bytes'] / 2**20:.2f}" for rows in per)
        later = [row["peak_bytes"] for rows in per for row in rows[1:]]
        after = sorted({(rows[1]["bytes_after_step"], rows[-1]["bytes_after_step"]) for rows in per})
        live = "; ".join(f"{a / 2**20:.2f} → {b / 2**20:.2f} MiB" for a, b in after)
        dloss = max(row["dloss_1rank"] for rows in per for row in rows)
        dgrad = max(row["dgrad_1rank"] for rows in per for row in rows)
        off = max(max(row["dloss_off"], row["dgrad_off"]) for rows in per for row in rows)
        out.append(f"| {mode} | {first} MiB | {min(later) / 2**20:.2f}–{max(later) / 2**20:.2f} MiB | {live} | "
                   f"{dloss:.2g} / {dgrad:.2g} | {'bit for bit' if off == 0 else f'{off:.2g}'} |")
    worst = max(range(steps), key=lambda i: max(pr["modes"]["off"][i]["dgrad_1rank"] for pr in d["per_rank"]))
    out += ["", f"Off itself is {max(pr['modes']['off'][worst]['dgrad_1rank'] for pr in d['per_rank']):.2g} from the "
                f"1-rank run's gradients at its worst step ({worst + 1}): the parallel run sums in another order "
                f"(TP and EP all-reduces, FSDP2's reduce-scatter), and AdamW carries the difference on; the run checks "
                f"the 1-rank run at {d['tolerance_1rank']:g} and every mode against off bit for bit. Budget's step 1 is "
                f"its profile (every op recomputed, as full); from step 2 every rank replays rank 0's plan."]
    return out


def cost_estimate(r):
    """The estimated op cost against the measured one on the main job's ops (bench/cost_estimate.py)."""
    d = load(r, "cost_estimate.json")
    m, t = d["model"], d["train"]
    out = [f"torch {d['torch']}, {d['threads']} threads, GLIBC_TUNABLES={d['glibc_tunables'] or '(unset)'}; "
           f"`{d['config']}` (Qwen3MoeForCausalLM {m['num_layers']} layers, hidden {m['hidden_size']}, "
           f"{m['num_experts']} experts top-{m['num_experts_per_tok']}, seq {t['seq_len']} x batch "
           f"{t['micro_batch']}, fp32), each layer a budget region profiled over {d['profiles']} steps (median). "
           f"Over the {d['ops']} profiled ops with a kernel, Spearman's rank correlation of the estimate with the "
           f"measurement is **{d['spearman']:.2f}**; over the {d['matmul_ops']} matmul-family and attention ops "
           f"(those with flops) **{d['spearman_matmuls']:.2f}**. Summed, the estimate is "
           f"{d['estimated_micros'] / d['measured_micros']:.2f}× the measured kernel time.", "",
           "| op (all occurrences, all layers) | ops | measured µs | estimated µs | estimated / measured |",
           "|---|---:|---:|---:|---:|"]
    kinds = sorted(d["per_kind"].items(), key=lambda kv: -kv[1]["measured_micros"])[:12]
    for name, k in kinds:
        out.append(f"| `{name}` | {k['ops']} | {k['measured_micros']:.0f} | {k['estimated_micros']:.0f} | "
                   f"{k['estimated_micros'] / k['measured_micros']:.2f}× |")
    return out


def machine(d):
    """Where a benchmark ran: torch, threads, CPUs, the load at the end, GLIBC_TUNABLES."""
    return (f"torch {d['torch']}, {d['threads'] or 'default'} threads on {d['cpus']} CPUs (1-minute load average "
            f"{d['load_average_at_end']:.1f} at the end), GLIBC_TUNABLES={d['glibc_tunables'] or '(unset)'}")


def _mib(b, sign=True):
    return "n/a" if b is None else (f"{b / 2**20:+.3f} MiB" if sign else f"{b / 2**20:.1f} MiB")


def soak(r):
    """docs/reliability.md "Memory across a run": the main job over many steps with dropped forwards, exceptions and
    rebuilds (bench/soak.py)."""
    d = load(r, "soak.json")
    first = next(iter(d["runs"].values()))
    every = first["samples"][0]["step"]
    omp = f"; OMP_NUM_THREADS={d['omp_num_threads']}" if "omp_num_threads" in d else ""
    out = [f"Measured by `bench/soak.py` ({machine(d)}{omp}; the longest run {d['wall_s'] / 60:.0f} min"
           f"): the main job (`{d['config']}`), a dropped forward and two exceptions every {first['faults_every']} "
           f"steps, sampled every {every} steps; the fit and the growth between rebuilds leave out the warm-up.", "",
           "| run | mode | steps | rebuilt every | warm-up | dropped forwards | exceptions (forward / recompute) | live "
           "tensor bytes after warm-up (min – max) | RSS growth per 1000 steps (fit) | between rebuilds | across each "
           "rebuild | RSS at the end | Invocations alive (max) |",
           "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for key, run in d["runs"].items():
        s = run["summary"]
        done = run["samples"][-1]["step"]
        steps = f"{done}" if done == run["steps"] else f"{done} of {run['steps']} (stopped)"
        warmup = s.get("warmup", done - s["samples_after_warmup"] * every)
        name = key.split(":")[0]
        for other in run.get("other_ranks", []):
            o = other["summary"]
            name += (f" (rank 0; rank {other['rank']}: tensor bytes {o['tensor_bytes_min']} – {o['tensor_bytes_max']}"
                     f", RSS {_mib(o['rss_growth_between_rebuilds_bytes_per_1000_steps'])} per 1000 steps between "
                     "rebuilds)")
        across = ", ".join(_mib(b) for b in s["rss_change_across_rebuilds_bytes"]) or "none"
        out.append(f"| {name} | {run['mode']} | {steps} | {run['rebuild_every']} | {warmup} | "
                   f"{run['dropped_forwards']} | {run['forward_faults']} / {run['recompute_faults']} | "
                   f"{s['tensor_bytes_min']} – {s['tensor_bytes_max']} | {_mib(s['rss_growth_bytes_per_1000_steps'])} | "
                   f"{_mib(s['rss_growth_between_rebuilds_bytes_per_1000_steps'])} | {across} | "
                   f"{_mib(s['rss_last'], sign=False)} | {s['invocations_alive_max']} |")
    return out


def plan_stability(r):
    """Three fresh processes per setting, their plans compared (bench/plan_stability.py)."""
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


def budget_frontier(r):
    """hpac's budget policy against off, full, the fixed selective policy and torch.compile's activation_memory_budget
    (bench/budget_frontier.py), per model: one row per method, then the issue's target read off the rows."""
    d = load(r, "budget_frontier.json")
    machine = (f"1-minute load average {d['load_average_at_start']:.1f} at the start, {d['load_average_at_end']:.1f} at "
            "the end" if "load_average_at_start" in d else "shared with other work: timings are noisy")
    out = [f"torch {d['torch']}, {d['threads']} threads on {d['cpus']} CPUs ({machine}), "
           f"GLIBC_TUNABLES={d['glibc_tunables'] or '(unset)'}; eager: median of {d['steps']} interleaved "
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


def compile_compare(r):
    """hpac eager and compiled beside torch.compile's own activation_memory_budget (bench/compile_compare.py): per
    model one row per method, peak and step time as ratios to eager off, compile time apart."""
    d = load(r, "compile_compare.json")
    out = [f"torch {d['torch']}, {d['threads']} threads on {d['cpus']} CPUs (1-minute load average "
           f"{d['load_average_at_start']:.1f} at the start, {d['load_average_at_end']:.1f} at the end), "
           f"GLIBC_TUNABLES={d['glibc_tunables'] or '(unset)'}, compiler {d['backend']}, median of {d['steps']} "
           "steps per method (forward + backward). Eager methods interleaved; each compiled method alternated with a "
           "fresh eager off model, whose median is its time reference. |dgrad|: the largest gradient difference "
           "from eager off of the same step."]
    for name, m in d["models"].items():
        rows = m["rows"]
        off = next(x for x in rows if x["method"] == "eager:off")
        out += ["", f"**{name}**: {m['shape']}", "",
                "| method | peak | vs eager off | step time (median) | vs eager off | compile | max abs dgrad vs off |",
                "|---|---|---|---|---|---|---|"]
        for x in rows:
            off_ms = x.get("off_ms_median_alongside", off["ms_median"])
            off_peak = x.get("off_peak_alongside", off["peak_bytes"])
            compile_s = f"{x['compile_s']:.0f} s" if "compile_s" in x else "-"
            out.append(f"| {x['method']} | {x['peak_bytes'] / 2**20:.1f} MiB | {x['peak_bytes'] / off_peak:.2f}x | "
                       f"{x['ms_median']:.0f} ms | {x['ms_median'] / off_ms:.2f}x | {compile_s} | "
                       f"{x['max_dgrad_vs_off']:.2g} |")
    return out


def target_shapes_regimes(d):
    """(a layer's weight-gradient bytes, the modes whose peak the kept activations set, those whose peak the gradients
    set) of a target_shapes JSON: a mode's peak above the start grows per layer by the larger of what a layer keeps and
    a layer's gradients (a third of what it holds at rest: weights and AdamW's two moments)."""
    der = d["derived"]
    grad = der["off"]["b_at_rest_bytes_per_layer"] / 3
    by_acts = [mode for mode, e in der.items() if e["b_above_start_bytes_per_layer"] > 1.05 * grad]
    return grad, by_acts, [mode for mode in der if mode not in by_acts]


def target_shapes_table(d):
    """The seed's table at the target's shapes (bench/target_shapes.py): one table per layer count, then the 48-layer
    peak derived per mode beside the seed's numbers, and what differs. `d` is the benchmark's JSON."""
    gib = 2 ** 30
    m = d["model"]
    where = (f"{d['device_name']}" if d["device"] != "cpu" else f"CPU ({d['device_name']}, {d['threads']} threads)")
    out = [f"transformers {d['transformers']} Qwen3MoeForCausalLM at Qwen3-30B-A3B's layer shapes (hidden "
           f"{m['hidden_size']}, {m['num_attention_heads']} / {m['num_key_value_heads']} heads of {m['head_dim']}, "
           f"top-{m['num_experts_per_tok']} of width {m['moe_intermediate_size']}) with {d['experts']} experts per "
           f"layer (the real model: 128) and vocabulary {d['vocab']} (the real: 151936); seq {d['seq']} x batch "
           f"{d['batch']}, {d['dtype']}, {d['optimizer']}; torch {d['torch']} on {where}, GLIBC_TUNABLES="
           f"{d['glibc_tunables'] or '(unset)'}, 1-minute load average {d['load_average_at_start']:.1f} at the start, "
           f"{d['load_average_at_end']:.1f} at the end, {d['wall_s'] / 60:.0f} min in all. One interleaved run per "
           f"layer count: a warm-up round, then {d['steps']} round{'s' * (d['steps'] > 1)} of every mode, the order "
           "rotated per round; step = forward + backward + AdamW; peak = the most bytes allocated during the step "
           "(weights, AdamW state, gradients, activations), above start = the same less the bytes held at the "
           "step's start (weights and AdamW state), before AdamW's step = the same over forward + backward only; "
           "kept = what the forward left for backward; time vs off = the median of per-round ratios."]
    for run in d["runs"]:
        rows = run["rows"]
        off = rows["off"]
        out += ["", f"**{run['layers']} layer(s)** ({run['parameters'] / 1e6:.0f}M parameters)", "",
                "| mode | peak | vs off | peak above start | vs off | of it before AdamW's step | kept after forward "
                "| vs off | step time (median; min–max) | vs off (paired) |", "|---|---|---|---|---|---|---|---|---|---|"]
        for mode, x in rows.items():
            fb = x.get("peak_above_start_before_optimizer_bytes")
            out.append(f"| {mode} | {x['peak_bytes'] / gib:.2f} GiB | {x['peak_bytes'] / off['peak_bytes']:.2f}x | "
                       f"{x['peak_above_start_bytes'] / gib:.2f} GiB | "
                       f"{x['peak_above_start_bytes'] / off['peak_above_start_bytes']:.2f}x | "
                       + (f"{fb / gib:.2f} GiB | " if fb is not None else "- | ") +
                       f"{x['kept_bytes'] / 2**20:.0f} MiB | {x['kept_bytes'] / off['kept_bytes']:.2f}x | "
                       f"{x['s_median']:.2f} s; {min(x['s_all']):.2f}–{max(x['s_all']):.2f} | "
                       f"{x['time_vs_off_paired']:.2f}x |")
    der, n = d["derived"], d["target_layers"]
    counts = ", ".join(str(r["layers"]) for r in d["runs"])
    last = d["runs"][-1]
    out += ["", f"**{n} layers, derived** from the {counts}-layer runs: peak(L) = a + b·L per mode (least squares); "
            "b = at rest (weights + AdamW state per layer: the slope of the step's starting bytes) + above the start "
            "(the slope of the peak above the start: what a layer adds at the peak); the check leaves the largest "
            "layer count out, fits the others and predicts it. Step time is not extrapolated (this machine's times "
            f"swing too much for a slope): its column is the paired ratio to off at {last['layers']} layers. The "
            f"seed's columns: the reference design's Qwen3-30B-A3B at seq 1024, {n} layers, bf16 on accelerators "
            "with a parallel layout.", "",
            f"| mode | a | b per layer (at rest + above the start) | kept per layer | derived peak | vs off | check: "
            f"predicted / measured | error | step time vs off ({last['layers']} layers, paired) | the seed's peak / "
            "step | peak vs off | time vs off |", "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    doff, soff = der["off"], d["seed"]["off"]
    for mode, e in der.items():
        loo = e.get("loo")
        check = (f"{loo['predicted_bytes'] / gib:.3f} / {loo['measured_bytes'] / gib:.3f} GiB ({loo['layers']} "
                 f"layers) | {100 * loo['error_rel']:+.2f} %") if loo else "- | -"
        seed = d["seed"].get(mode)
        seed_col = (f"{seed['peak_gb']:.2f} G / {seed['step_s']:.2f} s | {seed['peak_gb'] / soff['peak_gb']:.2f}x | "
                    f"{seed['step_s'] / soff['step_s']:.2f}x" if seed else "- | - | -")
        out.append(f"| {mode} | {e['a_bytes'] / gib:.2f} GiB | {e['b_bytes_per_layer'] / gib:.3f} GiB "
                   f"({e['b_at_rest_bytes_per_layer'] / gib:.3f} + {e['b_above_start_bytes_per_layer'] / gib:.3f}) | "
                   f"{e['b_kept_bytes_per_layer'] / 2**20:.0f} MiB | {e['peak_bytes_derived'] / gib:.1f} GiB | "
                   f"{e['peak_bytes_derived'] / doff['peak_bytes_derived']:.2f}x | {check} | "
                   f"{last['rows'][mode]['time_vs_off_paired']:.2f}x | {seed_col} |")
    errs = [abs(e["loo"]["error_rel"]) for e in der.values() if "loo" in e]
    rest = der["off"]["b_at_rest_bytes_per_layer"]
    grad, by_acts, by_grads = target_shapes_regimes(d)
    batch = d.get("batch", 1)
    kept = {mode: e["b_kept_bytes_per_layer"] for mode, e in der.items()}
    above = {mode: e["b_above_start_bytes_per_layer"] for mode, e in der.items()}
    width = 4 if d["dtype"] == "float32" else 2
    grads_128 = grad + (128 - d["experts"]) * 3 * m["hidden_size"] * m["moe_intermediate_size"] * width
    mib = lambda v: f"{v / 2**20:.0f} MiB"  # noqa: E731
    peaks = last["rows"]
    out += ["", "What differs from the seed's run, and what the derived column means:",
            f"- **Where the peak falls**: a layer's weight gradients take {grad / gib:.3f} GiB (a third of its at-rest "
            f"term: weights and AdamW's two moments); what a layer keeps for backward, at {batch} x {d['seq']} "
            "tokens: " + ", ".join(f"{mode} {mib(v)}" for mode, v in kept.items()) + ". Above the start a step's "
            "peak grows per layer by the larger of the two: every layer's kept bytes as backward starts, or every "
            "layer's gradients as it ends. "
            + (f"Activations set it under {', '.join(by_acts)} (per layer above the start: "
               + ", ".join(f"{above[mode] / gib:.3f}" for mode in by_acts) + " GiB)" if by_acts else
               "Activations set it under no mode")
            + (f"; gradients under {', '.join(by_grads)} (" + ", ".join(f"{above[mode] / gib:.3f}" for mode in by_grads)
               + " GiB)." if by_grads else ".")
            + (f" At {last['layers']} layers, above full's {peaks['full']['peak_bytes'] / gib:.2f} GiB: "
               + ", ".join(f"{mode} {(x['peak_bytes'] - peaks['full']['peak_bytes']) / gib:+.2f} GiB"
                           for mode, x in peaks.items() if mode != "full") + "." if "full" in peaks else "")]
    if batch > 1:
        below = [mode for mode in der if kept[mode] / batch < grad]
        out.append(f"- **Batch**: {batch} sequences of {d['seq']} per step (the seed's table names no batch): "
                   "activations grow with the tokens, gradients do not. Per sequence a layer keeps "
                   + ", ".join(f"{mode} {mib(v / batch)}" for mode, v in kept.items())
                   + (f"; at batch 1 {', '.join(below)} keep less per layer than a layer's gradients take, so their "
                      "peaks fall at the end of backward, full's regime." if below else "."))
    out += [f"- **Model**: {d['experts']} experts per layer instead of 128, vocabulary {d['vocab']} instead of "
            f"151936. At rest a layer holds {rest / gib:.3f} GiB here (weights and AdamW's two moments, {d['dtype']}): "
            "it grows with the expert count, what a layer keeps does not. At 128 experts a layer's gradients would "
            f"take about {grads_128 / gib:.2f} GiB here, "
            + ("more than any mode keeps per layer at this batch, so in one process no mode would move the peak."
               if grads_128 > max(kept.values()) else
               "less than " + ", ".join(mode for mode in der if kept[mode] > grads_128) + " keep per layer at this "
               "batch, so those would still set their peaks, the others would share one."),
            f"- **Parallel layout**: one process holds the whole model and every byte of its state; the seed's run "
            "split it over accelerators, sharding weights, gradients and AdamW state (not the activations of each "
            "device's tokens), which is how activations come to set its per-device peak.",
            f"- **Device and dtype**: {d['dtype']} on {where} against bf16 on accelerators: every byte here is twice a "
            "bf16 byte when float32, and the step times are this shared machine's (its load moved them by up to a "
            "factor of several between rounds), not comparable to the seed's seconds; only ratios to off are, and "
            "those loosely.",
            f"- **The fit**: a line per mode; the leave-largest-out check is off by at most {100 * max(errs):.2f} % "
            "over the modes" + (": the per-layer terms are constant from the first layer on." if max(errs) < 0.005
                                else ".") if errs else
            "- **The fit**: fewer than three layer counts, no check."]
    return out


def target_shapes(r):
    """docs/results.md "The seed's table at the target's shapes" (bench/target_shapes.py)."""
    return target_shapes_table(load(r, "target_shapes.json"))


def target_shapes_summary(r):
    """README's results paragraph: the 48-layer peaks derived by bench/target_shapes.py beside the seed's."""
    d = load(r, "target_shapes.json")
    der, seed, n = d["derived"], d["seed"], d["target_layers"]
    off = der["off"]["peak_bytes_derived"]
    errs = [abs(e["loo"]["error_rel"]) for e in der.values() if "loo" in e]
    ours = ", ".join(f"{mode} {e['peak_bytes_derived'] / 2**30:.1f} GiB"
                     + ("" if mode == "off" else f" ({e['peak_bytes_derived'] / off:.2f}×)")
                     for mode, e in der.items())
    theirs = ", ".join(f"{mode} {v['peak_gb']:.2f} G" + ("" if mode == "off" else
                                                        f" ({v['peak_gb'] / seed['off']['peak_gb']:.2f}×)")
                       for mode, v in seed.items())
    counts = "/".join(str(x["layers"]) for x in d["runs"])
    check = (f"; the line fitted without the largest layer count predicts it within {100 * max(errs):.1f} %"
             if errs else "")
    _, by_acts, by_grads = target_shapes_regimes(d)
    regimes = (f"activations set the peak of {', '.join(by_acts) or 'no mode'}, a layer's weight gradients that of "
               f"{', '.join(by_grads) or 'no mode'}")
    return [f"At Qwen3-30B-A3B's layer shapes with {d['experts']} experts per layer and vocabulary {d['vocab']}, "
            f"{d['dtype']} on {d['device']}, AdamW, seq {d['seq']} x batch {d.get('batch', 1)} "
            f"(`bench/target_shapes.py`, measured on {counts} layers{check}; {regimes}), the {n}-layer peak derived "
            f"per mode: {ours}; the seed's {n} layers in bf16 on accelerators with a parallel layout: {theirs}. "
            "docs/results.md, \"The seed's table at the target's shapes\", says what differs."]


def explain(r):
    """hpac-explain's report (docs/explain.md): the head of its per-op table in the CLI's layout, one JSON row, the peak
    per mode; all from the JSON the CLI wrote."""
    d = load(r, "explain.json")
    out = [f"From `bench/results/explain.json` ({d['source']}; region {d['region']}, mode {d['mode']}), the first "
           "rows of each phase in `hpac-explain`'s layout:", "", "```",
           f"{'phase':<10}{'op':<30}{'occ':>5}  {'decision':<10}{'out bytes':>12}{'kept bytes':>12}{'us':>10}  rule"]
    for phase in ("forward", "recompute"):
        for row in [o for o in d["ops"] if o["phase"] == phase][:8]:
            out.append(f"{phase:<10}{row['op']:<30}{row['occurrence']:>5}  {row['decision']:<10}{row['output_bytes']:>12}"
                       f"{row['kept_bytes']:>12}{row['micros']:>10.1f}  {row['rule']}")
    s = d["stats"]
    out += ["```", "", f"{len(d['ops'])} rows in all (forward and recompute, ignored ops included); the invocation saved "
                       f"{s['saved']} outputs, served {s['served']}, recomputed {s['recomputed']}"
                       + (f", skipped {s['skipped']} (nothing backward needed depended on them)" if s.get("skipped") else "")
                       + ".", "",
            "One row of the JSON as written (`ops[2]`):", "", "```json", json.dumps(d["ops"][2]), "```", "",
            "| mode | peak tensor bytes above the step's start | allocator events |", "|---|---:|---:|"]
    for t in d["timeline"]:
        out.append(f"| {t['mode']} | {t['peak_bytes'] / 2**20:.2f} MiB | {len(t['bytes'])} |")
    return out


def plan_oracle(r):
    """hpac's plans beside the MILP optimum of the additive objective, all replayed (bench/plan_oracle.py)."""
    d = load(r, "plan_oracle.json")
    out = [f"{machine(d)}; `{d['config']}`, every layer its own region, plans from the median of {d['profiles']} profiles; "
           f"times: median of {d['steps']} interleaved steps. Three plans per profile: hpac's (its dataflow choice), "
           "hpac's additive knapsack alone, the MILP optimum. Predicted µs are summed over the layers: additive = "
           "kernel time of what is not kept; dataflow = kernel time of the ops the recompute runs (skipped ones not).",
           "", "| budget | predicted additive µs: knapsack / optimum / hpac | predicted dataflow µs: hpac / knapsack / "
           "optimum | kept bytes: hpac / optimum | backward ms: off / hpac / knapsack / optimum | grads = off |",
           "|---:|---|---|---|---|---|"]
    for row in d["rows"]:
        h, k, o, f = row["hpac"], row["hpac_additive"], row["optimum"], row["off"]
        equal = "bit for bit" if all(x["grads_bitwise_equal_off"] for x in (h, k, o)) else "NO"
        out.append(f"| {row['budget']} | {k['additive_micros']:.0f} / {o['additive_micros']:.0f} / "
                   f"{h['additive_micros']:.0f} | {h['dataflow_micros']:.0f} / {k['dataflow_micros']:.0f} / "
                   f"{o['dataflow_micros']:.0f} | {h['kept_bytes'] / 2**20:.2f} / {o['kept_bytes'] / 2**20:.2f} MiB | "
                   f"{f['backward_ms']:.1f} / {h['backward_ms']:.1f} / {k['backward_ms']:.1f} / "
                   f"{o['backward_ms']:.1f} ms | {equal} |")
    gap = max((row["hpac_additive"]["additive_micros"] - row["optimum"]["additive_micros"])
              / max(row["optimum"]["additive_micros"], 1e-9) for row in d["rows"])
    wins = [row for row in d["rows"] if row["hpac"]["dataflow_micros"] < row["optimum"]["dataflow_micros"]]
    out += ["", f"- Additive objective: hpac's knapsack leaves at most {100 * gap:.2f} % more kernel time than the "
                "optimum at any budget here (the oracle tests hold it to 1 %)."]
    if wins:
        best = max(wins, key=lambda row: 1 - row["hpac"]["dataflow_micros"] / row["optimum"]["dataflow_micros"])
        out.append(f"- Dataflow objective: hpac's plan recomputes less than the additive optimum's at {len(wins)} of "
                   f"{len(d['rows'])} budgets; most at budget {best['budget']}: "
                   f"{best['hpac']['dataflow_micros']:.0f} µs against {best['optimum']['dataflow_micros']:.0f} µs "
                   f"({100 * (1 - best['hpac']['dataflow_micros'] / best['optimum']['dataflow_micros']):.0f} % less), "
                   "by keeping what autograd saves so that the ops feeding it are skipped, at a worse additive "
                   "value (Note [Planning with the dataflow]).")
    else:
        out.append("- Dataflow objective: at no budget does hpac's plan recompute less than the optimum's.")
    return out


def frontier_30b(r, name="frontier_30b.json"):
    """The frontier at Qwen3-30B-A3B's layer shapes (bench/frontier_30b.py): one table per (seq, dtype), then the
    targets read off the rows."""
    d = load(r, name)
    out = [f"torch {d['torch']}, {d['threads']} threads on {d['cpus']} CPUs (1-minute load average "
           f"{d['load_average_at_start']:.1f} at the start, {d['load_average_at_end']:.1f} at the end), "
           f"GLIBC_TUNABLES={d['glibc_tunables'] or '(unset)'}; median of {d['steps']} interleaved steps after a "
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


def torch_releases(r):
    """README "Compatibility": current torch releases from pip, one row each (tools/torch_release_check.sh VERSION)."""
    d = load(r, "torch_releases.json")
    out = ["| torch (pip) | build | configure; build (core + Python, jobs) | CTest entries passed | pytest passed / failed "
           "/ skipped | `pip install --no-build-isolation .`, `python -m hpac`, wheel smoke | run |",
           "|---|---|---|---|---|---|---|"]
    for version, e in d["releases"].items():
        kind = f"CUDA {e['cuda']} wheel, on CPU" if e["cuda_build"] else "CPU wheel"
        jobs = f"{e['jobs']} jobs" + (", with the trainer" if e["with_trainer"] else "")
        times = (f"{e['configure_s']} s; {e['build_s']} s ({jobs})" if e["build_s"] is not None
                 else f"not built ({e['failed_step']})")
        c, p, w = e["ctest"], e["pytest"], e["pip_install"]
        ctest = f"{c['passed']} of {c['total']}" if c["total"] else "not run"
        if c["failed"]:
            ctest += " (failed: " + ", ".join(f"`{t}`" for t in c["failed"]) + ")"
        pytest = f"{p['passed']} / {p['failed']} / {p['skipped']}" if p["passed"] is not None else "not run"
        if w["ok"] is None:
            pip = "not run"
        elif not w["ok"]:
            pip = "failed"
        else:
            pip = f"ok ({w['seconds']} s); smoke {'ok' if w['wheel_smoke_ok'] else 'failed'}"
        run = f"{e['date']}, {e['commit']}" + (" (modified tree)" if e["tree_modified"] else "") + \
            f", Python {e['python']}, {e['total_s']} s in all"
        out.append(f"| {e['torch']} | {kind} | {times} | {ctest} | {pytest} | {pip} | {run} |")
    return out


def recompute_floor(r):
    """docs/results.md "Where the main job's recompute time goes" (bench/recompute_floor.py)."""
    d = load(r, "recompute_floor.json")
    g = d["layer"]
    out = [f"torch {d['torch']}, {d['threads']} thread, {d['clock']}, GLIBC_TUNABLES={d['glibc_tunables']}; one "
           f"decoder layer (hidden {g['hidden']}, seq {g['seq']} x batch {g['batch']}, {g['experts']} experts top-"
           f"{g['top_k']}), {d['reps']} interleaved repetitions, medians", "",
           "| mode | forward ms | backward ms | of which the recompute, ms | step / off | recomputed | served | "
           "skipped | not reached (stopped early) | kept MiB | plan: kernel time it avoids |",
           "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for x in d["rows"]:
        plan = x.get("plan")
        avoided = (f"{100 * (plan['saved_micros'] + plan['skipped_micros']) / plan['total_micros']:.0f}%"
                   if plan and plan["total_micros"] else "")
        reached = x["ops_forward"] - x["ops_recompute"] if "ops_forward" in x else ""
        counts = (f"{x['recomputed']} | {x['served']} | {x['skipped']} | {reached} | {x['saved_bytes'] / 2**20:.2f}"
                  if "recomputed" in x else "| | | |")
        recompute = f"{x['recompute_ms']:.2f}" if not x["mode"].endswith("hpac's frame") else "-"
        out.append(f"| {x['mode']} | {x['forward_ms']:.2f} | {x['backward_ms']:.2f} | {recompute} | "
                   f"{x['total_vs_off']:.2f} | {counts} | {avoided} |")
    rows = {x["mode"]: x for x in d["rows"]}
    floor, full = rows["save_all"]["total_vs_off"], rows["full"]["total_vs_off"]
    out += ["", f"Reading it: re-running this layer with every savable op served (save_all; views re-run, they only "
            f"alias) costs {floor:.2f}× off — the floor of any mode that recomputes under torch.utils.checkpoint's "
            f"frame, which no choice of kept ops lowers; full costs "
            f"{full:.2f}×, so a plan can win at most {full - floor:.2f}× of off on this layer, while its kernel-time "
            f"model counts the recompute's whole cost as kernels (budget 0.5's plan avoids "
            f"{100 * (rows['budget 0.5']['plan']['saved_micros'] + rows['budget 0.5']['plan']['skipped_micros']) / rows['budget 0.5']['plan']['total_micros']:.0f}% "
            f"of the profiled kernel time and lands at {rows['budget 0.5']['total_vs_off']:.2f}×). Its forward costs "
            f"{rows['budget 0.5']['forward_ms'] - rows['budget 0.5, no skips']['forward_ms']:+.2f} ms against the same "
            "budget without skipping dead ops (which then need not watch what autograd saves, Note [Skips are "
            f"verified]), whose step is {rows['budget 0.5, no skips']['total_vs_off']:.2f}× off."]
    own = {k[:-len(", hpac's frame")]: v for k, v in rows.items() if k.endswith(", hpac's frame")}
    if own:
        out += ["", "Under hpac's own frame (`hpac.checkpoint`: it holds what needs no recompute, and its recompute "
                "stops after the last saved tensor it does not hold, Note [The recompute stops early]; its budget "
                "plans count the host time of every op the recompute reaches, Note [The recompute's fixed cost]): "
                + ", ".join(f"{k} {v['total_vs_off']:.2f}×" for k, v in own.items()) + f" off. Budget 1.0 there "
                "never re-runs the layer, so its cost over off is the forward's own price of a checkpoint region "
                f"({own['budget 1.0']['forward_ms'] - rows['off']['forward_ms']:+.2f} ms forward: hpac's fallback on "
                "every op, the frame's saved-tensor hooks in Python, the budget watching what autograd saves), which "
                "every checkpointed point pays on top of its recompute: no point near off's memory gets near off's "
                "time on this layer."]
    return out


def main_job_frontier(r):
    """docs/results.md "The budget's frontier on the main job" (bench/main_job_frontier.py)."""
    d = load(r, "main_job_frontier.json")
    m = d["model"]
    rows = d["rows"]
    out = [f"torch {d['torch']}, {d['threads']} thread on {d['cpus']} CPUs (1-minute load average "
           f"{d['load_average_at_end']:.1f} at the end), {d['clock']}, GLIBC_TUNABLES={d['glibc_tunables']}; "
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


TORCHTITAN_VARIANTS = {
    "off": "no activation checkpointing",
    "torchtitan": "torchtitan's `SelectiveAC` (its policy_fn through torch's SAC)",
    "hpac_torchtitan": "`hpac.torchtitan.apply_ac` (the rules as hpac's C++ kind `torchtitan`)",
    "hpac_policy_fn": "torchtitan's `SelectiveAC`, its policy_fn through hpac",
    "hpac_selective": "hpac's built-in `selective`",
    "hpac_budget": "hpac's eager budget 0.5",
}


def torchtitan_sac(r):
    """docs/results.md "torchtitan's selective checkpointing, run by hpac" (bench/torchtitan_sac.py)."""
    d = load(r, "torchtitan_sac.json")
    m = d["model"]
    out = [f"torch {d['torch']}, torchtitan {d['torchtitan']}, {d['threads']} thread(s), key {d['hpac_dispatch_key']}, "
           f"GLIBC_TUNABLES={d['glibc_tunables']}; {m['name']}: {m['layers']} layers, {m['experts']} experts top-"
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


SECTIONS = {
    "overhead": overhead, "step": step, "train_step": train_step, "peer": peer, "sac_peer": sac_peer,
    "sac_peer_reading": sac_peer_reading, "key_ratios": key_ratios, "scale": scale, "distributed": distributed,
    "hf_scale": hf_scale, "dist_torchrun": dist_torchrun, "dist_drift": dist_drift, "budget_frontier": budget_frontier,
    "cost_estimate": cost_estimate, "plan_stability": plan_stability, "plan_oracle": plan_oracle,
    "frontier_30b": frontier_30b,
    "target_shapes": target_shapes,
    "gpu_target_shapes": lambda r: target_shapes_table(load(r, "gpu_check_target_shapes.json")),
    "target_shapes_summary": target_shapes_summary,
    "policy_fn_overhead": policy_fn_overhead, "policy_fn_overhead_reading": policy_fn_overhead_reading,
    "frontier_30b_context_fn": lambda r: frontier_30b(r, "frontier_30b_context_fn.json"),
    "explain": explain,
    "compile_compare": compile_compare,
    "torch_releases": torch_releases,
    "recompute_floor": recompute_floor,
    "main_job_frontier": main_job_frontier,
    "torchtitan_sac": torchtitan_sac,
    "soak": soak,
}

REGION = re.compile(r"<!-- BEGIN generated (\S+) -->\n(.*?)<!-- END generated \1 -->\n", re.S)
QUOTED = re.compile(r"<!-- BEGIN quoted [^>]*-->\n.*?<!-- END quoted -->\n", re.S)
# A measured figure: a ratio (1.5×), a percentage, or a quantity in ms, ns or MiB.
FIGURE = re.compile(r"\d+\.\d+\s?×|\b\d+(?:\.\d+)?\s?%|\b\d+(?:\.\d+)?\s?(?:ms|ns|MiB)\b")


def render(text, results):
    """(new text, problems): every generated region replaced by its section."""
    problems = []

    def sub(m):
        name = m.group(1)
        if name not in SECTIONS:
            problems.append(f"unknown generated section '{name}' (known: {', '.join(sorted(SECTIONS))})")
            return m.group(0)
        try:
            body = "\n".join(SECTIONS[name](results))
        except FileNotFoundError as e:
            problems.append(f"section '{name}' needs {e.filename}, which is missing: run the benchmark that writes it")
            return m.group(0)
        return f"<!-- BEGIN generated {name} -->\n{body}\n<!-- END generated {name} -->\n"

    return REGION.sub(sub, text), problems


def stray_figures(text):
    """Lines outside generated and quoted regions that quote a measured figure."""
    blank = lambda m: "\n" * m.group(0).count("\n")
    rest = QUOTED.sub(blank, REGION.sub(blank, text))
    return [(n, line) for n, line in enumerate(rest.split("\n"), 1) if FIGURE.search(line)]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--results", default=os.path.join(ROOT, "bench", "results"))
    ap.add_argument("--write", nargs="+", metavar="DOC", help="rewrite the generated regions of these documents")
    ap.add_argument("--check", nargs="+", metavar="DOC", help="fail if a document differs from the JSON")
    args = ap.parse_args()
    if not args.write and not args.check:
        for name, fn in SECTIONS.items():
            try:
                print(f"<!-- {name} -->\n" + "\n".join(fn(args.results)) + "\n")
            except FileNotFoundError as e:
                print(f"<!-- {name} -->\n(not measured here: {os.path.relpath(e.filename, ROOT)} is missing)\n")
        return 0
    failed = False
    for path in args.write or args.check:
        with open(path) as f:
            text = f.read()
        new, problems = render(text, args.results)
        for n, line in stray_figures(text):
            problems.append(f"line {n} quotes a figure outside a generated region: {line.strip()}")
        if args.write and new != text:
            with open(path, "w") as f:
                f.write(new)
            print(f"{path}: regions rewritten from {args.results}")
        elif args.check and new != text:
            old_lines, new_lines = text.split("\n"), new.split("\n")
            n = next((i for i, (x, y) in enumerate(zip(old_lines, new_lines)) if x != y), min(len(old_lines), len(new_lines)))
            problems.append(f"line {n + 1} differs from the JSON:\n  document: {old_lines[n] if n < len(old_lines) else ''}"
                            f"\n  JSON:     {new_lines[n] if n < len(new_lines) else ''}\n  "
                            f"(bench/report_results.py --write {path})")
        for p in problems:
            print(f"{path}: {p}", file=sys.stderr)
        failed = failed or bool(problems)
    if args.check and not failed:
        print(f"every figure in {len(args.check)} document(s) matches {args.results}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
