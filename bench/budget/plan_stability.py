"""Are the budget plans stable from run to run on this machine? The main job's model (the transformers
Qwen3MoeForCausalLM of examples/training_demo/train.yaml), every decoder layer under
hpac.checkpoint_wrapper(policy=hpac.budget(0.5, profile_invocations=N, cost=C)); each setting runs three times, each in
a fresh process (estimated-pinned: estimated, with HPAC_ROOFLINE set to the roofline the parent measured), and the
plans are compared: the same plan in every layer, or, where they differ, the spread of the
plans' predicted recompute time (total − saved − skipped µs, summed over the layers, each run by its own profile).
The rule (Note [Plans from the median profile]): the same plan, or predicted recompute times within 2 %.
Written to bench/results/plan_stability.json.

    GLIBC_TUNABLES=glibc.malloc.mmap_threshold=33554432:glibc.malloc.trim_threshold=4294967296 \\
    .venv/bin/python -m bench.budget.plan_stability [--settings measured:1,measured:9,estimated:1]
"""
import argparse
import hashlib
import json
import os
import subprocess
import sys

from bench.common import CONFIG, RESULTS, ROOT, Run, child_env, module_command
COSTS = ("measured", "estimated", "estimated-pinned")


def one_run(cost, profiles):
    """In this process: profile, plan, print the plans as JSON."""
    import transformers
    transformers.logging.set_verbosity_error()
    import hpac
    import hpac.hf as hf
    import hpac.harness.models as hm
    config = hf.load_config(CONFIG)
    spec, train = config["model"], config["train"]
    model = hm.qwen3_moe_model(spec, train["seed"])
    budgets = [hpac.budget(0.5, profile_invocations=profiles, cost=cost.split("-")[0]) for _ in model.model.layers]
    for layer, b in zip(model.model.layers, budgets):
        hpac.checkpoint_wrapper(layer, policy=b)
    for step in range(profiles):
        ids = hm.token_batch(spec["vocab_size"], train["micro_batch"], train["seq_len"], train["seed"], step)
        model(input_ids=ids, labels=ids).loss.backward()
        model.zero_grad(set_to_none=True)
    layers = []
    for b in budgets:
        st = b.status()
        text = b._region.plan_text()
        decisions = "".join(line.split()[0][0] for line in text.splitlines()
                            if line.split() and line.split()[0] in ("keep", "recompute", "skip"))
        layers.append({"decisions": hashlib.sha256(decisions.encode()).hexdigest()[:16],
                       "saved_ops": st["saved_ops"], "skipped_ops": st["skipped_ops"],
                       "predicted_recompute_micros": st["total_micros"] - st["saved_micros"] - st["skipped_micros"]})
    print(json.dumps(layers))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--settings", default="measured:1,measured:5,measured:9,estimated:1,estimated-pinned:1",
                    help="comma-separated COST:PROFILES (cost measured, estimated or estimated-pinned: estimated on "
                         "the roofline this process measures, pinned in every run by HPAC_ROOFLINE; profiles >= 1)")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--out", default=os.path.join(RESULTS, "plan_stability.json"))
    ap.add_argument("--one", default=None, help=argparse.SUPPRESS)  # COST:PROFILES, in a child process
    args = ap.parse_args()
    settings = []
    for item in (args.one or args.settings).split(","):
        cost, _, n = item.partition(":")
        if cost not in COSTS or not n.isdigit() or int(n) < 1:
            ap.error(f"setting '{item}' is not allowed; allowed: COST:PROFILES with COST one of {', '.join(COSTS)} "
                     "and PROFILES an integer >= 1")
        settings.append((cost, int(n)))
    if args.one:
        return one_run(*settings[0])
    if args.runs < 2:
        ap.error(f"--runs {args.runs}: allowed: an integer >= 2")
    import torch
    import hpac
    # estimated-pinned: every run's estimates on this process's roofline (HPAC_ROOFLINE), measured once here.
    r = hpac.roofline("cpu")
    pin = f"{r['flops_per_us']:.6g}:{r['bytes_per_us']:.6g}"
    run = Run("plan_stability", args.out)
    results = []
    for cost, n in settings:
        runs = []
        env = child_env()
        if cost == "estimated-pinned":
            env["HPAC_ROOFLINE"] = pin
        else:
            env.pop("HPAC_ROOFLINE", None)
        for r in range(args.runs):
            out = subprocess.run(module_command("bench.budget.plan_stability", "--one", f"{cost}:{n}"), check=True,
                                 capture_output=True, text=True, cwd=ROOT, env=env).stdout
            runs.append(json.loads(out.strip().splitlines()[-1]))
            print(f"{cost}:{n} run {r + 1}/{args.runs}", flush=True)
        same_layers = sum(len({run[i]["decisions"] for run in runs}) == 1 for i in range(len(runs[0])))
        predicted = [sum(layer["predicted_recompute_micros"] for layer in run) for run in runs]
        spread = (max(predicted) - min(predicted)) / min(predicted) if min(predicted) > 0 else 0.0
        same = same_layers == len(runs[0])
        results.append({"cost": cost, "profiles": n, "runs": runs, "layers": len(runs[0]),
                        "layers_with_one_plan": same_layers, "predicted_recompute_micros": predicted,
                        "spread": spread, "rule_met": same or spread < 0.02})
        print(f"{cost}:{n}: {same_layers}/{len(runs[0])} layers with one plan, predicted recompute spread "
              f"{100 * spread:.1f} %", flush=True)
    run.data.update(config=os.path.relpath(CONFIG, ROOT), budget=0.5, pinned_roofline=pin, settings=results,
                    child_threads=int(os.environ.get("OMP_NUM_THREADS", "0")) or None)
    run.save()
    print(f"wrote {args.out}")


if __name__ == "__main__":
    sys.exit(main())
