"""The memory budget's frontier on the main job (issue: no budget point dominated by full or selective).

The main job's model (the transformers Qwen3MoeForCausalLM of examples/training_demo/train.yaml, its seq and batch),
every decoder layer its own checkpoint under hpac's own frame (hpac.checkpoint_wrapper: it holds what needs no
recompute and its recompute stops early, Note [The recompute stops early]). Modes: off, full, the fixed selective
policy, and per budget fraction two plans: hpac's (profiled over --profiles forwards, planned with Note [The
recompute's fixed cost]) and the exact optimum of the planner's additive objective (the MILP of
hpac.harness.plan_oracle, Note [An exact oracle for the planner]) for the same profile, both written as plan files
and replayed by hpac (bench.common.oracle_plans's plan_files, which bench/budget/plan_oracle.py uses too). Every
model runs one step per round, the order rotated each round, after one warm-up round; per step: CPU time of the one
thread (torch.set_num_threads(1), time.thread_time: stable on a shared machine, where wall time is not) of forward +
backward, and the peak of CPU tensor bytes above the step's start (hpac's tracking allocator); gradients against
off's, bit for bit.

The frontier off / full / selective span: the piecewise-linear curve through those of the three that no other of
them beats on both peak and time, sorted by peak. A budget point is on or beyond it when its median step time is at
most the frontier's time at its peak (a point with less peak than full is judged against full's time).

    GLIBC_TUNABLES=glibc.malloc.mmap_threshold=33554432:glibc.malloc.trim_threshold=4294967296 \\
      .venv/bin/python -m bench.budget.main_job_frontier [--budgets 0.1,...,0.9] [--steps 12] [--profiles 5]
"""
import argparse
import copy
import os
import statistics
import sys
import tempfile
import time

from bench.common import CONFIG, RESULTS, ROOT, environment, write_json
from bench.common.oracle_plans import plan_files

DEFAULT_OUT = os.path.join(RESULTS, "main_job_frontier.json")
FIXED = ("off", "full", "selective")


def parse_args(argv):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--budgets", default="0.1,0.2,0.3,0.4,0.5,0.6,0.7,0.8,0.9")
    ap.add_argument("--steps", type=int, default=12, help="measured rounds (>= 10), after one warm-up round")
    ap.add_argument("--profiles", type=int, default=5, help="profiled forwards per region (median)")
    ap.add_argument("--out", default=DEFAULT_OUT)
    args = ap.parse_args(argv)
    try:
        args.budgets = [float(b) for b in args.budgets.split(",")]
    except ValueError:
        ap.error(f"--budgets {args.budgets!r} is not allowed; allowed: comma-separated fractions in [0, 1]")
    if not all(0 <= b <= 1 for b in args.budgets):
        ap.error(f"--budgets {args.budgets} is not allowed; allowed: fractions in [0, 1]")
    if args.steps < 10 or args.profiles < 1:
        ap.error(f"--steps {args.steps} / --profiles {args.profiles} not allowed; allowed: --steps >= 10, "
                 "--profiles >= 1")
    return args


def measured_step(model, ids):
    """(thread CPU seconds of forward + backward, peak tensor bytes above the step's start, gradients):
    bench.common.timing's timed_step on the thread's clock."""
    from bench.common.timing import timed_step
    seconds, peak, _ = timed_step(model, lambda m, x: m(input_ids=x, labels=x, use_cache=False).loss, ids,
                                  clock=time.thread_time)
    return seconds, peak, [p.grad for p in model.parameters()]


def frontier_time(fixed, peak):
    """The step time of the frontier off / full / selective span at `peak` (see the module's text)."""
    points = sorted((v["peak_bytes"], v["step_ms"]) for v in fixed.values())
    efficient = [p for p in points if not any(q != p and q[0] <= p[0] and q[1] <= p[1] for q in points)]
    if peak <= efficient[0][0]:
        return efficient[0][1]
    for (p0, t0), (p1, t1) in zip(efficient, efficient[1:]):
        if peak <= p1:
            return t0 + (t1 - t0) * (peak - p0) / (p1 - p0) if p1 > p0 else min(t0, t1)
    return efficient[-1][1]


def summarise(times, peaks, bitwise, predicted, regions):
    rows = {}
    for name in times:
        rows[name] = {"step_ms": 1e3 * statistics.median(times[name]),
                      "step_ms_all": [1e3 * t for t in times[name]],
                      "peak_bytes": statistics.median(peaks[name]),
                      "grads_bitwise_equal_off": bool(bitwise[name])}
        if name in predicted:
            rows[name].update(predicted[name])
    off = rows["off"]
    for name, row in rows.items():
        row["step_vs_off"] = row["step_ms"] / off["step_ms"]
        row["peak_vs_off"] = row["peak_bytes"] / off["peak_bytes"]
    fixed = {k: rows[k] for k in FIXED}
    for name, row in rows.items():
        if name in FIXED:
            continue
        frontier = frontier_time(fixed, row["peak_bytes"])
        row["frontier_step_ms"] = frontier
        row["vs_frontier"] = row["step_ms"] / frontier
        row["on_or_beyond"] = row["step_ms"] <= frontier
        row["budget_bytes"] = sum(b.status()["budget_bytes"] for b in regions[name])
    return rows


def main(argv=None):
    args = parse_args(argv)
    import torch
    import transformers
    transformers.logging.set_verbosity_error()
    import hpac
    import hpac.hf as hf
    import hpac.harness.compare as hc
    import hpac.harness.models as hm
    from hpac.harness.parity import compare
    torch.set_num_threads(1)
    hpac.track_memory()
    started = time.perf_counter()

    def log(msg):
        print(f"[main_job_frontier {time.perf_counter() - started:.0f}s] {msg}", flush=True)

    config = hf.load_config(CONFIG)
    spec, train = config["model"], config["train"]
    base = hm.qwen3_moe_model(spec, train["seed"])

    def batch(step):
        return hm.token_batch(spec["vocab_size"], train["micro_batch"], train["seq_len"], train["seed"], step)

    models = {"off": copy.deepcopy(base)}
    for mode in ("full", "selective"):
        models[mode] = copy.deepcopy(base)
        for layer in models[mode].model.layers:
            hpac.checkpoint_wrapper(layer, policy=mode)
    tmp = tempfile.mkdtemp(prefix="hpac-main-job-frontier-")
    predicted, regions = {}, {}
    for fraction in args.budgets:
        plans, pred, regs = plan_files(base, fraction, batch, args.profiles, tmp)
        for kind in ("hpac", "optimum"):
            name = f"{kind}:{fraction}"
            predicted[name] = dict(pred[kind])
            if kind == "hpac":  # Note [The recompute's fixed cost]: hpac's own prediction, summed over the layers
                predicted[name]["recompute_micros"] = sum(b.status()["recompute_micros"] for b in regs)
            regions[name] = regs
            models[name] = copy.deepcopy(base)
            for layer, path in zip(models[name].model.layers, plans[kind]):
                hpac.checkpoint_wrapper(layer, policy=hpac.budget(plan=path))
        log(f"budget {fraction}: planned ({args.profiles} profiles per layer)")
    times = {k: [] for k in models}
    peaks = {k: [] for k in models}
    bitwise = {k: True for k in models}
    log(f"{len(models)} models, {args.steps} measured rounds after one warm-up, order rotated each round")
    for step in range(args.steps + 1):
        grads = {}
        for name in hc.rotated(list(models), step):
            seconds, peak, grads[name] = measured_step(models[name], batch(step))
            if step:
                times[name].append(seconds)
                peaks[name].append(peak)
        for name in models:
            bitwise[name] &= compare(grads[name], grads["off"])[0] == 0
        if step:
            log(f"round {step}/{args.steps}")
    rows = summarise(times, peaks, bitwise, predicted, regions)
    for name, row in rows.items():
        extra = f"  frontier {row['frontier_step_ms']:.1f} ms: {'on or beyond' if row['on_or_beyond'] else 'inside'}" \
            if "frontier_step_ms" in row else ""
        log(f"{name:14s} step {row['step_ms']:7.1f} ms ({row['step_vs_off']:.2f}x off)  peak "
            f"{row['peak_bytes'] / 2**20:6.2f} MiB ({row['peak_vs_off']:.2f}x off){extra}")
    out = {**environment("main_job_frontier"),
           "clock": "time.thread_time (CPU time of the one thread)", "config": os.path.relpath(CONFIG, ROOT),
           "model": {"layers": spec["num_layers"], "hidden": spec["hidden_size"],
                     "experts": spec["num_experts"], "top_k": spec["num_experts_per_tok"],
                     "seq": train["seq_len"], "batch": train["micro_batch"]},
           "steps": args.steps, "profiles": args.profiles, "budgets": args.budgets,
           "load_average_at_end": os.getloadavg()[0], "wall_s": time.perf_counter() - started, "rows": rows}
    write_json(args.out, out)
    log(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
