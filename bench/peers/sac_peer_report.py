"""docs/results.md "hpac vs PyTorch's own SAC": section sac_peer (the step and per-op tables) and
the figures sac_peer_figures gives the prose that reads them, from bench/results/sac_peer.json (bench/peers/sac_peer.py)."""
from bench.common.report import load, span, tunables


def sac_peer(r):
    d = load(r, "sac_peer.json")
    mib = 2 ** 20
    out = [f"torch {d['torch']}, {d['threads']} thread(s), key {d['hpac_dispatch_key']}, "
           f"GLIBC_TUNABLES={tunables(d)}", "",
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


def sac_peer_figures(r):
    """The figures docs/results.md's reading of the tables quotes in its own prose (<!-- fig sac_peer.KEY -->)."""
    d = load(r, "sac_peer.json")
    mib = 2 ** 20
    steps = d["steps"]
    same = all(x["hpac"]["peak_bytes"] == x["pytorch_sac"]["peak_bytes"] and
               x["hpac"]["kept_bytes"] == x["pytorch_sac"]["kept_bytes"] for x in steps)
    bitwise = all(x["hpac"]["grads_bitwise_equal_off"] and x["pytorch_sac"]["grads_bitwise_equal_off"] for x in steps)
    extra = d["per_op"]["extra_ns_per_op_over_plain"]
    shortest, longest = min(s["seq"] for s in steps), max(s["seq"] for s in steps)
    small = [x["time_ratio_hpac_over_pytorch_sac"]["median"] for x in steps if x["seq"] == shortest]
    large = [x["time_ratio_hpac_over_pytorch_sac"]["median"] for x in steps if x["seq"] >= 512]
    worst = max(steps, key=lambda x: x["time_ratio_hpac_over_pytorch_sac"]["max"])
    kept = {x["attention"]: x["hpac"]["kept_bytes"] / mib for x in steps if x["seq"] == longest}
    return {
        "memory": ("exactly the same tensors (peak and kept equal to the byte in every row)" if same else
                   "NOT the same tensors in every row (peak or kept differ)"),
        "gradients": ("every gradient is bitwise equal to off's. Only time differs" if bitwise else
                      "NOT every gradient is bitwise equal to off's"),
        "hpac_ns": f"{extra['hpac_region']:+.0f} ns", "sac_ns": f"{extra['pytorch_sac_caching_mode']:+.0f} ns",
        "per_op_ratio": f"{extra['pytorch_sac_caching_mode'] / extra['hpac_region']:.0f}×",
        "noop_ns": f"{extra['python_noop_mode']:+.0f} ns", "small_seq": f"seq {shortest}",
        "small": f"{span(small, '{:.2f}')}×", "large_seqs": f"seq 512–{longest}", "large": f"{span(large, '{:.2f}')}×",
        "worst": f"{worst['time_ratio_hpac_over_pytorch_sac']['max']:.2f} at seq {worst['seq']} {worst['attention']}",
        "serve_ns": f"{extra['hpac_serve']:+.0f} ns", "eager_kept": f"{kept['eager']:.1f} MiB kept at seq {longest}",
        "sdpa_kept": f"{kept['sdpa']:.1f} MiB",
    }
