"""The main job on the real transformers Qwen3MoeForCausalLM: the hpac-train YAML's model section builds the Hugging
Face model (random weights from the seed; nothing downloaded), hpac.hf.prepare applies the YAML's rules, and the
model is trained with AdamW under off, full, selective and (when the YAML has activation_checkpoint.memory_budget)
budget, interleaved step by step, then the comparison table: the same table hpac-train --compare prints (Note [One
table for the main job], tools/trainer/trainer.cpp).

    python -m hpac.harness.demo --config examples/training_demo/train.yaml [--steps N] [--json out.json]

Exit status 1 when a mode differs from off in any loss or gradient: bit for bit eagerly; with
train.compile: true (each layer compiled after wrapping, against compiled off) within --compile-tolerance, since the
compiler fuses the recomputing graphs differently.
"""
import argparse
import json
import os
import sys
import warnings

import torch

import hpac
import hpac.hf as hf
from . import compare as hc
from . import models


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m hpac.harness.demo", description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", required=True, help="hpac-train YAML (model: a qwen3_moe preset)")
    parser.add_argument("--steps", type=int, default=None, help="override train.steps (a positive integer)")
    parser.add_argument("--json", default=None, help="also write the table rows to this file")
    parser.add_argument("--compile-backend", default="inductor",
                        help="torch.compile backend with train.compile: true (default inductor)")
    parser.add_argument("--compile-tolerance", type=float, default=1e-5,
                        help="with train.compile: true, the largest |dloss| and |dgrad| against compiled off (fp32)")
    args = parser.parse_args(argv)
    if args.steps is not None and args.steps < 1:
        parser.error(f"--steps {args.steps} is not allowed; allowed: a positive integer")

    warnings.filterwarnings("ignore", category=FutureWarning)
    import transformers
    transformers.logging.set_verbosity_error()

    config = hf.load_config(args.config)
    spec, train = config["model"], config["train"]
    if not spec["preset"].startswith("qwen3_moe"):
        parser.error(f"model.preset '{spec['preset']}' is not allowed here; allowed: qwen3_moe_tiny, "
                     "qwen3_moe_30b_a3b (the real Qwen3MoeForCausalLM is built from the model section)")
    if train["dtype"] != "float32":
        parser.error(f"train.dtype '{train['dtype']}' is not allowed here; allowed: float32 (peak memory is "
                     "counted by hpac's CPU tracking allocator)")
    steps = args.steps or train["steps"]

    def build():
        return models.qwen3_moe_model(spec, train["seed"])

    def progress(step, runs):
        cells = "  ".join(f"{m} loss {r.losses[-1].item():.4f} {1000 * r.times[-1]:.0f}ms" for m, r in runs.items())
        print(f"[hpac.hf] step {step + 1}/{steps}  {cells}", flush=True)

    print(f"[hpac.hf] transformers {transformers.__version__} Qwen3MoeForCausalLM from {args.config}: "
          f"{spec['num_layers']} layers, hidden {spec['hidden_size']}, {spec['num_experts']} experts top-"
          f"{spec['num_experts_per_tok']}, seq {train['seq_len']} x batch {train['micro_batch']}, {steps} AdamW "
          f"steps; torch {torch.__version__}, {torch.get_num_threads()} threads, GLIBC_TUNABLES="
          f"{os.environ.get('GLIBC_TUNABLES', '(unset)')}", flush=True)
    memory_budget = config["activation_checkpoint"].get("memory_budget")
    modes = hc.MODES + (("budget",) if memory_budget else ())
    runs = hc.train_compare(
        build, config,
        lambda step: models.token_batch(spec["vocab_size"], train["micro_batch"], train["seq_len"], train["seed"],
                                        step),
        steps=steps, modes=modes, lr=train["lr"], progress=progress, log=hf.log_to_stderr,
        compile_backend=args.compile_backend)
    rows = hc.summary(runs, memory_budget["text"] if memory_budget else None)
    print(hc.format_table(rows))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"transformers": transformers.__version__, "torch": torch.__version__, "config": config,
                       "steps": steps, "rows": rows}, f, indent=2)
    tolerance = args.compile_tolerance if train["compile"] else 0.0
    bad = [r["mode"] for r in rows if not (r["max_dloss"] <= tolerance and r["max_dgrad"] <= tolerance)]
    if bad:
        print(f"MISMATCH: {', '.join(bad)} differ from off (tolerance {tolerance:g})", file=sys.stderr)
        return 1
    how = (f"within {tolerance:g} of compiled off ({args.compile_backend}, each layer compiled)" if train["compile"]
           else "equal off bit for bit")
    print(f"OK: {', '.join(m for m in modes if m != 'off')} {how} over {steps} steps (loss and every gradient); "
          f"hpac {hpac.version()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
