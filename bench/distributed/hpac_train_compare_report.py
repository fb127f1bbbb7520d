"""docs/distributed.md "What is tested" (section distributed): hpac-train --compare per layout (parity with one
rank, collectives, FSDP gathers, rank 0's peaks), from bench/results/distributed.json (bench/distributed/hpac_train_compare.py)."""
from bench.common.report import load


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
