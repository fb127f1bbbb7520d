"""The whole-step memory target on the main job (issue: fit the step into the memory you name).

The main job's model (the transformers Qwen3MoeForCausalLM of examples/training_demo/train.yaml, its seq and batch),
prepared by hpac.hf.prepare, trained with AdamW. First every fixed mode a user could pick by hand — off, full,
selective, memory_budget 0.1 ... 0.9 — then memory_target at --targets points evenly between full's and off's
measured step peak. Each run builds its model afresh (the same seed and batches), with nothing else alive, runs
--warmup steps then --steps timed steps; per step: the peak of the process's live CPU tensor bytes over forward,
backward and optimizer step (hpac's tracking allocator, absolute: what a target counts), and the CPU time of the one
thread (torch.set_num_threads(1), time.thread_time) of the same. Every step's peak counts, the warm-up's and the
first (profile) step's included: a run's peak is its largest, and each target row counts its steps over the target. Runs follow each other in one process (not
interleaved: the target measures absolute bytes, which another live model would change). Losses against off's, bit
for bit. Per target: the plan's predicted peak and the measured one, slack (target - measured) / target, the fastest
fixed mode whose measured peak fits the same target, and the step-time ratio.

--shapes 30b: the same at Qwen3-30B-A3B's layer shapes (bench/scale/target_shapes.py's model: hidden 2048, 32/4 heads,
top-8 of --experts experts of width 768, vocabulary --vocab), --layers layers, --batch x --seq tokens, fp32.

    GLIBC_TUNABLES=glibc.malloc.mmap_threshold=33554432:glibc.malloc.trim_threshold=4294967296 \\
      .venv/bin/python -m bench.budget.memory_target [--targets 6] [--steps 5] [--warmup 2]
    .venv/bin/python -m bench.budget.memory_target --plot bench/results/memory_target.json docs/results_memory_target.svg
    ... python -m bench.budget.memory_target --shapes 30b --layers 2 --batch 2 --seq 1024 --out bench/results/memory_target_30b_2.json
    ... python -m bench.budget.memory_target --shapes 30b --layers 4 --batch 1 --seq 1024 --out bench/results/memory_target_30b_4.json
    ... python -m bench.budget.memory_target --shapes 30b --layers 1 --batch 2 --seq 1024 --fixed off,full,selective \\
      --out bench/results/memory_target_30b_1.json
"""
import argparse
import gc
import json
import os
import sys

import torch

import hpac
import hpac.hf as hf

from bench.common import CONFIG, RESULTS, ROOT, Run, child_env, module_command
from bench.common.config_run import run

FIXED = ["off", "full", "selective"] + [f"budget:{f / 10:.1f}" for f in range(1, 10)]


def _memtracker_child(mode, args):
    """The MemTracker step of `mode` in a fresh process (this script with --memtracker-one)."""
    import subprocess
    argv = module_command("bench.budget.memory_target", "--memtracker-one", mode, "--warmup", args.warmup + 1,
                          "--shapes", args.shapes, "--layers", args.layers, "--batch", args.batch, "--seq", args.seq,
                          "--experts", args.experts, "--vocab", args.vocab, "--threads", args.threads)
    out = subprocess.run(argv, check=True, capture_output=True, text=True, cwd=ROOT, env=child_env()).stdout
    return json.loads(out.strip().splitlines()[-1])


def parse_args():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--targets", type=int, default=6)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--out", default=os.path.join(RESULTS, "memory_target.json"))
    ap.add_argument("--shapes", choices=("main", "30b"), default="main")
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--batch", type=int, default=3)
    ap.add_argument("--seq", type=int, default=1024)
    ap.add_argument("--experts", type=int, default=8)
    ap.add_argument("--vocab", type=int, default=4096)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--fixed", default=",".join(FIXED), help="the fixed modes beside the targets (off and full first)")
    ap.add_argument("--memtracker", action="store_true", help="per run, one more step under PyTorch's MemTracker, in "
                    "a process of its own (MemTracker leaves tensors alive that would count in the next run)")
    ap.add_argument("--memtracker-one", default=None, help=argparse.SUPPRESS)  # a child: one mode, JSON on stdout
    return ap.parse_args()


def base_config(args):
    """The main job's config, at Qwen3-30B-A3B's layer shapes under --shapes 30b."""
    base = hf.load_config(CONFIG)
    if args.shapes == "30b":
        import transformers
        transformers.logging.set_verbosity_error()
        text = (f"model: {{preset: qwen3_moe_30b_a3b, num_layers: {args.layers}, num_experts: {args.experts}, "
                f"vocab_size: {args.vocab}}}\ntrain: {{seq_len: {args.seq}, micro_batch: {args.batch}, "
                "lr: 1.0e-3, seed: 1234}\n")
        shaped = hf.parse_config(text, "memory_target_30b.yaml")
        base = dict(base, model=shaped["model"], train=dict(base["train"], **{k: shaped["train"][k] for k in
                                                                             ("seq_len", "micro_batch")}))
    return base


def target_row(base, target, fixed, args, log):
    """One target's run against the fixed modes (the error as the result below the model's floor)."""
    try:
        r = run(base, f"target:{target}", args.warmup, args.steps)
    except hpac.MemoryTargetError as e:  # below the model's floor: the error is the result
        gc.collect()
        log(f"target {target / 2**20:.2f} MiB: {str(e)[:160]}")
        return {"target_bytes": target, "error": str(e)}
    if args.memtracker:
        r["memtracker"] = _memtracker_child(f"target:{target}", args)
    planned = [h for h in r["target"]["history"] if h["planned"]]
    fits = [m for m, f in fixed.items() if f["peak_bytes"] <= target]
    best = min(fits, key=lambda m: fixed[m]["median_thread_s"]) if fits else None
    row = {"target_bytes": target, "predicted_bytes": r["target"]["predicted_bytes"],
           "predicted_event": r["target"]["predicted_event"], "measured_bytes": r["peak_bytes"],
           "measured_event": planned[-1]["measured_event"] if planned else None,
           "slack": (target - r["peak_bytes"]) / target,
           "prediction_error": (r["target"]["predicted_bytes"] - r["peak_bytes"]) / r["peak_bytes"],
           "first_step_bytes": r["first_step_peak_bytes"],
           "steps_over_target": sum(step["peak_bytes"] > target for step in r["steps"]),
           "median_thread_s": r["median_thread_s"], "layers": r["target"]["layers"],
           "losses_equal_off": r["losses"] == fixed["off"]["losses"], "fastest_fixed": best,
           "fastest_fixed_thread_s": fixed[best]["median_thread_s"] if best else None,
           "steps": r["steps"], "memtracker": r["memtracker"]}
    log(f"target {target / 2**20:.2f} MiB: measured {row['measured_bytes'] / 2**20:.2f} (step 1 "
        f"{row['first_step_bytes'] / 2**20:.2f}, {row['steps_over_target']} of {len(r['steps'])} steps over), predicted "
        f"{row['predicted_bytes'] / 2**20:.2f}, slack {100 * row['slack']:.1f}%, "
        f"{row['median_thread_s'] * 1e3:.0f} ms vs {best} {row['fastest_fixed_thread_s'] * 1e3 if best else 0:.0f} ms")
    return row


def main():
    if sys.argv[1:2] == ["--plot"]:  # --plot JSON SVG
        from bench.budget.memory_target_report import plot
        with open(sys.argv[2]) as f:
            plot(json.load(f), sys.argv[3])
        return
    args = parse_args()
    torch.set_num_threads(args.threads)
    hpac.track_memory()
    base = base_config(args)
    if args.memtracker_one:
        print(json.dumps(run(base, args.memtracker_one, args.warmup, 0, True)["memtracker"]))
        return
    out = Run("memory_target", args.out, config=os.path.relpath(CONFIG, ROOT), shapes=args.shapes,
              model=base["model"], seq=base["train"]["seq_len"], batch=base["train"]["micro_batch"],
              warmup=args.warmup, steps=args.steps)
    fixed = {}
    for mode in args.fixed.split(","):
        fixed[mode] = run(base, mode, args.warmup, args.steps)
        if args.memtracker:
            fixed[mode]["memtracker"] = _memtracker_child(mode, args)
        out.log(f"{mode}: peak {fixed[mode]['peak_bytes'] / 2**20:.2f} MiB, "
                f"{fixed[mode]['median_thread_s'] * 1e3:.0f} ms")
    lo, hi = fixed["full"]["peak_bytes"], fixed["off"]["peak_bytes"]
    targets = [int(lo + (hi - lo) * k / (args.targets + 1)) for k in range(1, args.targets + 1)]
    if hi - lo < 0.005 * hi:  # checkpointing saves (next to) nothing at this step's peak: no target between them
        out.log(f"full's peak {lo / 2**20:.2f} MiB is within 0.5% of off's {hi / 2**20:.2f} MiB: no target between them")
        targets = []
    out.data["fixed"] = {m: {k: v for k, v in f.items() if k != "target"} for m, f in fixed.items()}
    out.data["losses_equal_off"] = {m: f["losses"] == fixed["off"]["losses"] for m, f in fixed.items()}
    out.data["sweep"] = [target_row(base, target, fixed, args, out.log) for target in targets]
    out.save()
    out.log(f"wrote {args.out}")


if __name__ == "__main__":
    main()
