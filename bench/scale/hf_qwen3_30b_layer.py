"""The seed's scale on CPU: decoder layers of the real Qwen3-30B-A3B shapes, built by transformers'
Qwen3MoeForCausalLM from a config with the real dimensions (hidden 2048, 32 heads / 4 KV heads, head_dim 128, 128
experts top-8, moe_intermediate 768, norm_topk_prob, rope_theta 1e6), trained in bfloat16 at seq 1024 under off, full
and selective through hpac.hf. A benchmark, not a test.

    .venv/bin/python -m bench.scale.hf_qwen3_30b_layer [--layers 1] [--seq 1024] [--steps 3] [--vocab 4096]
                                                 [--out bench/results/hf_qwen3_30b_layer.json]

One mode at a time (a single layer's experts are 604M parameters: weights, gradients and AdamW state of three models
at once would not fit this machine), each from the same seed. Peak is the tensor bytes above the step's start during
forward + backward (hpac's CPU tracking allocator), kept is what the forward left allocated for backward, step time
is the median over the steps after the first. The vocabulary is cut to --vocab (the real 151936 would add an
embedding and head of 311M parameters each, the same in every mode). Losses of full and selective are compared with
off (max |dloss|) in the same run.
"""
import argparse
import os
import time
import warnings

import torch

from bench.common import RESULTS, environment, write_json


def report(path):
    """The docs/results.md section, from the one renderer (bench/report.py, section hf_scale)."""
    from bench.scale.hf_qwen3_30b_layer_report import hf_scale
    print("\n".join(hf_scale(os.path.dirname(os.path.abspath(path)))))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--layers", type=int, default=1)
    ap.add_argument("--seq", type=int, default=1024)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--vocab", type=int, default=4096)
    ap.add_argument("--report", metavar="JSON", default=None,
                    help="print the docs/results.md table from a JSON this script wrote, and exit")
    ap.add_argument("--out", default=os.path.join(RESULTS, "hf_qwen3_30b_layer.json"))
    args = ap.parse_args()
    if args.report:
        report(args.report)
        return
    for name in ("layers", "seq", "batch", "steps", "vocab"):
        if getattr(args, name) < 1:
            ap.error(f"--{name} {getattr(args, name)} is not allowed; allowed: a positive integer")

    warnings.filterwarnings("ignore", category=FutureWarning)
    import transformers
    transformers.logging.set_verbosity_error()
    import hpac
    import hpac.hf as hf
    import hpac.harness.compare as hc
    import hpac.harness.models as hm

    config = hf.parse_config(f"model: {{preset: qwen3_moe_30b_a3b, num_layers: {args.layers}, vocab_size: "
                             f"{args.vocab}}}\ntrain: {{seq_len: {args.seq}, micro_batch: {args.batch}, dtype: "
                             f"bfloat16}}\n", "qwen3_30b_a3b_layer.yaml")
    spec = config["model"]

    def build():
        return hm.qwen3_moe_model(spec, 1234, dtype=torch.bfloat16, max_position_embeddings=max(4096, args.seq))

    def batch(step):
        return hm.token_batch(spec["vocab_size"], args.batch, args.seq, 1234, step)

    registry = hf.load_registry()
    rows, losses = [], {}
    for mode in ("off", "full", "selective"):
        t0 = time.perf_counter()
        runs = hc.train_compare(build, config, batch, steps=args.steps, modes=(mode,), registry=registry,
                                log=None, progress=lambda s, r: print(f"  {mode} step {s + 1}/{args.steps} "
                                                                      f"{1000 * r[mode].times[-1]:.0f} ms",
                                                                      flush=True))
        run = runs[mode]
        losses[mode] = [loss.float().item() for loss in run.losses]
        times = sorted(run.times[1:] or run.times)
        rows.append({"mode": mode, "route": run.prep.route, "wrapped": run.wrapped,
                     "peak_bytes": max(run.peaks[1:] or run.peaks), "kept_after_forward_bytes": run.kept[-1],
                     "step_time_s": times[len(times) // 2], "step_times_s": run.times,
                     "recomputed": sum(s.get("recomputed", 0) for s in run.layer_stats[-1]),
                     "served": sum(s.get("served", 0) for s in run.layer_stats[-1]), "losses": losses[mode],
                     "wall_s": time.perf_counter() - t0})
        del runs, run
    off = rows[0]
    for r in rows:
        r["peak_vs_off"] = r["peak_bytes"] / off["peak_bytes"]
        r["kept_vs_off"] = r["kept_after_forward_bytes"] / off["kept_after_forward_bytes"]
        r["time_vs_off"] = r["step_time_s"] / off["step_time_s"]
        r["max_dloss_vs_off"] = max(abs(a - b) for a, b in zip(r["losses"], off["losses"]))
        print(f"{r['mode']:<10} peak {r['peak_bytes'] / 2**20:8.1f} MiB ({r['peak_vs_off']:.2f}x)  kept "
              f"{r['kept_after_forward_bytes'] / 2**20:8.1f} MiB ({r['kept_vs_off']:.2f}x)  step "
              f"{r['step_time_s']:.2f} s ({r['time_vs_off']:.2f}x)  route {r['route']}  max|dloss| "
              f"{r['max_dloss_vs_off']:.3g}")
    result = {**environment("hf_qwen3_30b_layer"), "model": spec, "rows": rows,
              "args": {k: v for k, v in vars(args).items() if k not in ("out", "report")}}
    write_json(args.out, result)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
