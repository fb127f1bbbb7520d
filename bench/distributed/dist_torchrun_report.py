"""docs/distributed.md's torchrun tables (bench/distributed/dist_torchrun.py): section dist_torchrun (FSDP2, DTensor TP,
expert parallel) from bench/results/dist_torchrun.json, and section dist_drift (20 steps on 4 ranks, every mode)
from bench/results/dist_drift.json (its --drift run)."""
from bench.common.report import load


FUNCOL_SHORT = {"_c10d_functional::all_reduce": "all_reduce", "_c10d_functional::all_to_all_single": "all_to_all"}


def _issued(counts, phase, op):
    c = counts[phase].get(op)
    return (c["issued"], c["served"]) if c else (0, 0)


def dist_torchrun(r):
    """Level1 on torchrun (bench/distributed/dist_torchrun.py): FSDP2, DTensor TP, expert parallel."""
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
    """20 steps on 4 ranks with TP x EP x FSDP2 and every mode (python -m bench.distributed.dist_torchrun --drift): per mode, the ranks'
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
