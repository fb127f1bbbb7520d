"""docs/results.md "Real Qwen3-30B-A3B layer shapes" (section hf_scale): the layer through hpac.hf, from
bench/results/hf_qwen3_30b_layer.json (bench/scale/hf_qwen3_30b_layer.py, which prints it too)."""
from bench.common.report import load, span


def hf_scale(r):
    """Real Qwen3-30B-A3B layer shapes through hpac.hf (bench/scale/hf_qwen3_30b_layer.py)."""
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
