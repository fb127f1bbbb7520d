"""docs/results.md "Estimated op costs against the measurement" (section cost_estimate), from
bench/results/cost_estimate.json (bench/budget/cost_estimate.py)."""
from bench.common.report import load, tunables


def cost_estimate(r):
    """The estimated op cost against the measured one on the main job's ops (bench/budget/cost_estimate.py)."""
    d = load(r, "cost_estimate.json")
    m, t = d["model"], d["train"]
    out = [f"torch {d['torch']}, {d['threads']} threads, GLIBC_TUNABLES={tunables(d)}; "
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
