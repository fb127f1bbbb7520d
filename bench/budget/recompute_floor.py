"""Where the main job's recompute time goes: one decoder layer of the main job's model (the transformers
Qwen3MoeForCausalLM of examples/training_demo/train.yaml), checkpointed with torch.utils.checkpoint and hpac's
context_fn, under off / full / selective / budget 0.3 / budget 0.5 / save_all.

save_all keeps every op's outputs: its recompute re-runs the layer's Python and dispatches every op, but serves each
one from storage (views aside: they only alias what is served), so no kernel of substance runs. Its cost over off is the floor of any mode that re-runs the region: what a
plan cannot remove by choosing which kernels to skip under torch.utils.checkpoint's frame (the module code, the dispatcher, hpac's fallback, autograd
recording the recomputed graph). A budget plan's kernel-time model (the profile's kernel micros) sees none of it.

Measured as CPU time of the one thread that runs everything (torch.set_num_threads(1), time.thread_time): stable on a
shared machine, where wall time is not. Modes interleaved, the order rotated each repetition; medians.

    GLIBC_TUNABLES=... .venv/bin/python -m bench.budget.recompute_floor [--reps 30] [--out PATH]
"""
import argparse
import os
import statistics
import sys
import time


import torch

import hpac
from hpac.harness import checkpoint_with
import hpac.hf as hf
import hpac.harness.models as hm

from bench.common import CONFIG, RESULTS, environment, write_json

DEFAULT_OUT = os.path.join(RESULTS, "recompute_floor.json")


class Timed:
    """A context around one of context_fn's contexts, adding its thread CPU time to `acc` (early stop's exception
    passes through)."""

    def __init__(self, inner, acc):
        self.inner, self.acc = inner, acc

    def __enter__(self):
        self.t = time.thread_time()
        return self.inner.__enter__()

    def __exit__(self, *exc):
        try:
            return self.inner.__exit__(*exc)
        finally:
            self.acc[-1] += time.thread_time() - self.t


def interleave(order, step, times, reps):
    """Three warm-up rounds of every mode (the budgets' profiles, caches), their times dropped, then `reps` rounds,
    the order rotated each round."""
    for warm in range(3):  # the budgets' profiles, caches
        for mode in order:
            step(mode)
    for mode in order:
        for k in times[mode]:
            times[mode][k].clear()
    print(f"[recompute_floor] {reps} interleaved repetitions of {len(order)} modes", flush=True)
    for rep in range(reps):
        k = rep % len(order)
        for mode in order[k:] + order[:k]:
            step(mode)
        if (rep + 1) % 10 == 0:
            print(f"[recompute_floor] {rep + 1}/{reps}", flush=True)


def summarize(order, times, stats, budgets):
    """One row per mode: medians of its times, its ratio to off, its invocation's counts and its budget's plan."""
    off_total = statistics.median(f + b for f, b in zip(times["off"]["forward"], times["off"]["backward"]))
    rows = []
    for mode in order:
        t = times[mode]
        total = [f + b for f, b in zip(t["forward"], t["backward"])]
        row = {"mode": mode, "forward_ms": 1e3 * statistics.median(t["forward"]),
               "backward_ms": 1e3 * statistics.median(t["backward"]),
               "recompute_ms": 1e3 * statistics.median(t["recompute"]),
               "total_ms": 1e3 * statistics.median(total),
               "total_vs_off": statistics.median(total) / off_total}
        if mode in stats:
            row.update({k: stats[mode][k] for k in ("ops_forward", "ops_recompute", "recomputed", "served",
                                                    "skipped", "saved_bytes")})
        if mode in budgets:
            st = budgets[mode].status()
            row["plan"] = {k: st[k] for k in ("kept_bytes", "off_bytes", "saved_ops", "skipped_ops", "planned_ops",
                                              "saved_micros", "skipped_micros", "total_micros", "recompute_micros")}
        rows.append(row)
        print(f"[recompute_floor] {mode:11s} forward {row['forward_ms']:6.2f} ms  backward {row['backward_ms']:6.2f} "
              f"ms  recompute {row['recompute_ms']:6.2f} ms  total {row['total_vs_off']:.2f}x off", flush=True)
    return rows


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--reps", type=int, default=30, help="interleaved repetitions (>= 5)")
    parser.add_argument("--out", default=DEFAULT_OUT)
    args = parser.parse_args(argv)
    if args.reps < 5:
        parser.error(f"--reps {args.reps} is not allowed; allowed: an integer >= 5")
    import transformers
    transformers.logging.set_verbosity_error()
    torch.set_num_threads(1)
    config = hf.load_config(CONFIG)
    spec, train = config["model"], config["train"]
    model = hm.qwen3_moe_model(spec, train["seed"])
    layer = model.model.layers[0]
    batch, seq, hidden = train["micro_batch"], train["seq_len"], spec["hidden_size"]
    torch.manual_seed(1)
    x0 = torch.randn(batch, seq, hidden)
    positions = torch.arange(seq).unsqueeze(0).expand(batch, seq)
    rope = model.model.rotary_emb(x0, positions)

    def run_layer(x):
        out = layer(x, position_embeddings=rope, attention_mask=None, position_ids=positions)
        return out[0] if isinstance(out, tuple) else out

    budgets = {"budget 0.3": hpac.budget(0.3), "budget 0.5": hpac.budget(0.5),
               "budget 0.5, no skips": hpac.budget(0.5, skip_dead=False)}
    # hpac's own frame (hpac.checkpoint): it holds what needs no recompute and its recompute stops early (Note [The
    # recompute stops early]); its budget regions plan for that (Note [The recompute's fixed cost]).
    own = {f"{k}, hpac's frame": v for k, v in (("budget 0.3", hpac.budget(0.3)), ("budget 0.5", hpac.budget(0.5)),
                                                ("budget 0.9", hpac.budget(0.9)), ("budget 1.0", hpac.budget(1.0)))}
    budgets.update(own)
    frames = {"full, hpac's frame": "full", "selective, hpac's frame": "selective", **own,
              "save_all, hpac's frame": "save_all"}
    modes = {"off": None, "full": "full", "selective": "selective", **budgets, "save_all": "save_all", **frames}
    times = {m: {"forward": [], "backward": [], "recompute": []} for m in modes}
    stats = {}

    def step(mode):
        x = x0.clone().requires_grad_(True)
        t = times[mode]
        t["recompute"].append(0.0)
        start = time.thread_time()
        if modes[mode] is None:
            y = run_layer(x)
        elif mode in frames:
            invocation = hpac.Invocation(modes[mode])
            invocations = [invocation]
            y = checkpoint_with(invocation, run_layer, x)
        else:
            invocations = []
            inner = hpac.context_fn(modes[mode], on_invocation=invocations.append)

            def context_fn():
                forward, recompute = inner()
                return forward, Timed(recompute, t["recompute"])
            y = torch.utils.checkpoint.checkpoint(run_layer, x, use_reentrant=False, context_fn=context_fn)
        mid = time.thread_time()
        y.square().sum().backward()
        end = time.thread_time()
        t["forward"].append(mid - start)
        t["backward"].append(end - mid)
        if modes[mode] is not None:
            stats[mode] = invocations[0].stats()

    order = list(modes)
    interleave(order, step, times, args.reps)
    rows = summarize(order, times, stats, budgets)
    out = {**environment("recompute_floor"), "clock": "time.thread_time (CPU time of the one thread)", "reps": args.reps,
           "layer": {"hidden": hidden, "seq": seq, "batch": batch, "experts": spec["num_experts"],
                     "top_k": spec["num_experts_per_tok"]},
           "rows": rows}
    write_json(args.out, out)
    print(f"[recompute_floor] wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
