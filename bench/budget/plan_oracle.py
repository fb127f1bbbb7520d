"""hpac's budget plans beside the exact optimum of the planner's additive objective (Note [An exact oracle for the
planner], policy/budget_plan.h; the MILP of hpac.harness.plan_oracle, scipy's milp), on the main job's model (the
transformers Qwen3MoeForCausalLM of examples/training_demo/train.yaml), every decoder layer its own region.

Per budget: each layer's region is profiled (--profiles forwards, measured cost, the plan from the median) and
planned by hpac (its dataflow choice, and its additive knapsack alone over the same groups); the MILP's optimum for
the same profile and budget becomes a plan file too (skip marks, for every plan, as hpac's dataflow analysis gives
them for that choice). Both are then replayed by hpac from their plan files
(hpac.checkpoint_wrapper(layer, policy=hpac.budget(plan=...))) on their own copies of the model, interleaved with
off, the order rotated every step. Reported per budget, summed over the layers: the predicted recompute time under
the additive objective (kernel µs of the groups not kept) and under hpac's dataflow objective (µs of the ops the
recompute runs, skipped ones not), and measured: forward and backward time (median of --steps), gradients against
off (bit for bit). Written to bench/results/plan_oracle.json.

    GLIBC_TUNABLES=glibc.malloc.mmap_threshold=33554432:glibc.malloc.trim_threshold=4294967296 \\
    .venv/bin/python -m bench.budget.plan_oracle [--budgets 0.1,0.3,0.5,0.7,0.9] [--steps 7] [--profiles 5]
"""
import argparse
import copy
import json
import os
import statistics
import sys
import tempfile
import time

from bench.common import CONFIG, RESULTS, ROOT, environment
from bench.common.oracle_plans import plan_files, split_step


def parse_args():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--budgets", default="0.1,0.3,0.5,0.7,0.9")
    ap.add_argument("--steps", type=int, default=7, help="measured steps per plan, after one warm-up")
    ap.add_argument("--profiles", type=int, default=5, help="profiled forwards per region (Note [Plans from the "
                                                            "median profile])")
    ap.add_argument("--out", default=os.path.join(RESULTS, "plan_oracle.json"))
    args = ap.parse_args()
    try:
        args.budgets = [float(b) for b in args.budgets.split(",")]
    except ValueError:
        ap.error(f"--budgets {args.budgets!r} is not allowed; allowed: comma-separated fractions in [0, 1]")
    if not all(0 <= b <= 1 for b in args.budgets) or args.steps < 1 or args.profiles < 1:
        ap.error("allowed: --budgets fractions in [0, 1], --steps and --profiles positive integers")
    return args


def replay(base, plans, batch, steps):
    """Off and every plan (replayed from its files) on their own copies of `base`, interleaved, the order rotated
    every step, one warm-up step. Returns ({name: {"forward": [s], "backward": [s]}}, {name: gradients bit for bit
    equal to off's in every step})."""
    import hpac
    import hpac.harness.compare as hc
    from hpac.harness.parity import compare
    models = {"off": copy.deepcopy(base)}
    for name, paths in plans.items():
        models[name] = copy.deepcopy(base)
        for layer, path in zip(models[name].model.layers, paths):
            hpac.checkpoint_wrapper(layer, policy=hpac.budget(plan=path))
    times = {k: {"forward": [], "backward": []} for k in models}
    bitwise = {k: True for k in models}
    for step in range(steps + 1):
        grads = {}
        for name in hc.rotated(list(models), step):
            fwd, bwd, grads[name] = split_step(models[name], batch(step))
            if step:
                times[name]["forward"].append(fwd)
                times[name]["backward"].append(bwd)
        for name in models:
            bitwise[name] &= compare(grads[name], grads["off"])[0] == 0
    return times, bitwise


def budget_row(fraction, regions, predicted, times, bitwise):
    row = {"budget": fraction, "budget_bytes": sum(b.status()["budget_bytes"] for b in regions),
           "layers": len(regions)}
    for name in times:
        fwd = statistics.median(times[name]["forward"])
        bwd = statistics.median(times[name]["backward"])
        row[name] = {"forward_ms": 1e3 * fwd, "backward_ms": 1e3 * bwd,
                     "forward_ms_all": [1e3 * t for t in times[name]["forward"]],
                     "backward_ms_all": [1e3 * t for t in times[name]["backward"]],
                     "grads_bitwise_equal_off": bool(bitwise[name])}
        if name in predicted:
            row[name].update(predicted[name])
    return row


def budget_line(row):
    hpac, optimum = row["hpac"], row["optimum"]
    return (f"budget {row['budget']}: predicted additive hpac {hpac['additive_micros']:.0f} vs optimum "
            f"{optimum['additive_micros']:.0f} µs, dataflow hpac {hpac['dataflow_micros']:.0f}"
            f" vs optimum {optimum['dataflow_micros']:.0f} µs; backward off / hpac / optimum "
            + " / ".join(f"{row[k]['backward_ms']:.1f}" for k in ("off", "hpac", "optimum")) + " ms; additive "
            f"knapsack {row['hpac_additive']['additive_micros']:.0f} µs")


def write_results(args, rows, started):
    import torch
    with open(args.out, "w") as f:
        json.dump({**environment("plan_oracle"), "config": os.path.relpath(CONFIG, ROOT),
                   "steps": args.steps, "profiles": args.profiles, "load_average_at_end": os.getloadavg()[0],
                   "wall_s": time.perf_counter() - started, "rows": rows}, f, indent=1)
        f.write("\n")


def main():
    args = parse_args()
    import transformers
    transformers.logging.set_verbosity_error()
    import hpac.hf as hf
    import hpac.harness.models as hm
    import hpac.harness.plan_oracle as plan_oracle  # noqa: F401 (scipy: missing, the run stops before the first profile)

    started = time.perf_counter()
    log = lambda msg: print(f"[plan_oracle {time.perf_counter() - started:.0f}s] {msg}", flush=True)
    config = hf.load_config(CONFIG)
    spec, train = config["model"], config["train"]
    base = hm.qwen3_moe_model(spec, train["seed"])
    batch = lambda step: hm.token_batch(spec["vocab_size"], train["micro_batch"], train["seq_len"], train["seed"],
                                        step)
    tmp = tempfile.mkdtemp(prefix="hpac-plan-oracle-")
    rows = []
    for fraction in args.budgets:
        plans, predicted, regions = plan_files(base, fraction, batch, args.profiles, tmp)
        times, bitwise = replay(base, plans, batch, args.steps)
        rows.append(budget_row(fraction, regions, predicted, times, bitwise))
        log(budget_line(rows[-1]))
        write_results(args, rows, started)
    log(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
