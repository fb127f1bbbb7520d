"""How well the estimated op cost (Note [Estimated op costs], replay/op_cost.h) ranks the main job's ops against the
measured kernel times: the transformers Qwen3MoeForCausalLM of examples/training_demo/train.yaml, each decoder layer
under hpac.checkpoint_wrapper(policy=hpac.budget(0.5, profile_invocations=N)); after N profiled steps every layer's
profile holds, per counted op, the median measured time and the roofline estimate. Written to
bench/results/cost_estimate.json: Spearman's rank correlation over all profiled ops (views excluded: they run no
kernel), the same over the ops of each kind, the roofline, and the 12 ops with the longest measured time.

    GLIBC_TUNABLES=glibc.malloc.mmap_threshold=33554432:glibc.malloc.trim_threshold=4294967296 \\
    .venv/bin/python -m bench.budget.cost_estimate [--profiles 5] [--out bench/results/cost_estimate.json]
"""
import argparse
import os
import sys

from bench.common import CONFIG, RESULTS, ROOT, environment, write_json


def ranks(values):
    """Ranks from 1, ties given their mean rank."""
    order = sorted(range(len(values)), key=lambda i: values[i])
    out = [0.0] * len(values)
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and values[order[j + 1]] == values[order[i]]:
            j += 1
        for k in range(i, j + 1):
            out[order[k]] = (i + j) / 2 + 1
        i = j + 1
    return out


def spearman(a, b):
    ra, rb = ranks(a), ranks(b)
    n = len(a)
    ma, mb = sum(ra) / n, sum(rb) / n
    cov = sum((x - ma) * (y - mb) for x, y in zip(ra, rb))
    va = sum((x - ma) ** 2 for x in ra) ** 0.5
    vb = sum((y - mb) ** 2 for y in rb) ** 0.5
    return cov / (va * vb) if va and vb else float("nan")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", default=CONFIG)
    ap.add_argument("--profiles", type=int, default=5, help="profiled steps per layer, the median taken (>= 1)")
    ap.add_argument("--out", default=os.path.join(RESULTS, "cost_estimate.json"))
    args = ap.parse_args()
    if args.profiles < 1:
        ap.error(f"--profiles {args.profiles}: allowed: an integer >= 1")
    import transformers
    transformers.logging.set_verbosity_error()
    import hpac
    import hpac.hf as hf
    import hpac.harness.models as hm
    config = hf.load_config(args.config)
    spec, train = config["model"], config["train"]
    model = hm.qwen3_moe_model(spec, train["seed"])
    budgets = []
    for layer in model.model.layers:
        budgets.append(hpac.budget(0.5, profile_invocations=args.profiles))
        hpac.checkpoint_wrapper(layer, policy=budgets[-1])
    for step in range(args.profiles):
        ids = hm.token_batch(spec["vocab_size"], train["micro_batch"], train["seq_len"], train["seed"], step)
        model(input_ids=ids, labels=ids).loss.backward()
        model.zero_grad(set_to_none=True)
        print(f"profiled step {step + 1}/{args.profiles}", flush=True)
    ops = [dict(p, layer=i) for i, b in enumerate(budgets) for p in b.profile() if p["estimated_micros"] > 0]
    if not ops:
        sys.exit("no profiled op has an estimate: did every layer finish its profile?")
    measured = [p["micros"] for p in ops]
    estimated = [p["estimated_micros"] for p in ops]
    kinds = {}
    for p in ops:
        kinds.setdefault(p["op"], []).append(p)
    per_kind = {name: {"ops": len(ps), "measured_micros": sum(p["micros"] for p in ps),
                       "estimated_micros": sum(p["estimated_micros"] for p in ps)} for name, ps in kinds.items()}
    # The roofline the estimates used, read back from one matmul: flops / time where compute bound.
    top = sorted(ops, key=lambda p: -p["micros"])[:12]
    result = {
        **environment("cost_estimate"), "config": os.path.relpath(args.config, ROOT),
        "model": spec, "train": train, "profiles": args.profiles, "ops": len(ops), "layers": len(budgets),
        "spearman": spearman(measured, estimated),
        "spearman_matmuls": spearman([p["micros"] for p in ops if p["flops"] > 0],
                                     [p["estimated_micros"] for p in ops if p["flops"] > 0]),
        "matmul_ops": sum(1 for p in ops if p["flops"] > 0),
        "measured_micros": sum(measured), "estimated_micros": sum(estimated),
        "per_kind": per_kind, "top": top,
    }
    write_json(args.out, result)
    print(f"{len(ops)} ops over {len(budgets)} layers: Spearman {result['spearman']:.3f} "
          f"(matmuls: {result['spearman_matmuls']:.3f} over {result['matmul_ops']}); wrote {args.out}")


if __name__ == "__main__":
    main()
