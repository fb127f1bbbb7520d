"""docs/results.md "Where the main job's recompute time goes" (section recompute_floor), from
bench/results/recompute_floor.json (bench/budget/recompute_floor.py)."""
from bench.common.report import load, tunables


def recompute_floor(r):
    """docs/results.md "Where the main job's recompute time goes" (bench/budget/recompute_floor.py)."""
    d = load(r, "recompute_floor.json")
    g = d["layer"]
    out = [f"torch {d['torch']}, {d['threads']} thread, {d['clock']}, GLIBC_TUNABLES={tunables(d)}; one "
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
