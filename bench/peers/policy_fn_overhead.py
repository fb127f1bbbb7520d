"""Per-op cost of bringing your own Python policy_fn: hpac against PyTorch's own SAC, forward and recompute apart.

One region of many tiny ops (--iters times `h = mm(h, w); h = h * 0.5; h = h + x` on 8x8 float32 tensors, x and w
requiring grad), so that per-op costs dominate, under torch.utils.checkpoint.checkpoint(use_reentrant=False) with

  off                  no checkpoint (the region called plainly)
  full                 checkpoint without context_fn's policy: both contexts do nothing (torch's noop_context_fn)
  torch_sac_fn         torch.utils.checkpoint.create_selective_checkpoint_contexts(policy_fn)
  hpac_fn              hpac.create_selective_checkpoint_contexts(policy_fn)
  torch_sac_list       torch.utils.checkpoint.create_selective_checkpoint_contexts([aten.mm.default])
  hpac_list            hpac.create_selective_checkpoint_contexts([aten.mm.default])   (a C++ save list)
  hpac_selective       hpac.context_fn("selective")   (hpac's built-in rules, in C++; they save every 2nd mm)
  full_flop, torch_sac_fn_flop, hpac_fn_flop
                       as full / torch_sac_fn / hpac_fn with a FlopCounterMode entered around backward: hpac's
                       recompute then pushes an innermost Python mode (_ServedOpsMode) that sends the ops it serves
                       past the outer mode (Note [Outer dispatch modes see what ran]); torch's SAC always has its own.

policy_fn answers MUST_SAVE for aten.mm.default and PREFER_RECOMPUTE for everything else, the same as the list.

How each phase is timed. Every checkpoint variant's context_fn returns its two contexts wrapped in a timer (the
timer starts before the inner context is entered and stops after it exits, so entering and leaving a mode or an hpac
region is inside), and `full` wraps two null contexts the same way:
  forward    the whole checkpoint call (checkpoint(region, x, ...) from call to return; `off`: region(x));
             the time inside the forward context alone is kept too (forward_region)
  recompute  the time inside the recompute context, which torch.utils.checkpoint enters during backward to rerun
             the region (it stops early once the last saved tensor is repacked: the ops after the last mm do not
             rerun; the number of region ops the recompute reruns is counted once, in a calibration run of `full`
             with a counting dispatch mode inside each context, and divides the recompute time)
  backward   loss.backward() from call to return (recompute included); minus off's backward of the same
             repetition, a cross-check of the recompute figure that needs no wrapping.
Per op: time / ops. Every repetition runs every variant --inner times back to back and keeps each phase's fastest
run (short timings on a shared machine), the variants' order rotated each repetition; each figure is a median over
repetitions, and every difference ("extra") and ratio is taken within a repetition (paired) before the
median. The garbage collector is off while a repetition runs (collected between repetitions). The policy function
counts the times it is asked, per phase, under both implementations (recorded: they must agree), and every
variant's gradients are compared bitwise with off's.

Run (about 30 s on 2 idle cores) with the glibc settings the other benchmarks use:

    GLIBC_TUNABLES=glibc.malloc.mmap_threshold=33554432:glibc.malloc.trim_threshold=4294967296 \\
    HPAC_LIBRARY=build/plugin/libhpac.so .venv/bin/python -m bench.peers.policy_fn_overhead
"""
import argparse
import contextlib
import gc
import os
from statistics import median
import sys
import time

import torch

import hpac
from hpac.harness.compare import rotated

from bench.common import RESULTS, environment, finish, torch_at_least

if not torch_at_least(2, 4):
    sys.exit(f"bench/peers/policy_fn_overhead.py: PyTorch's selective checkpointing needs torch >= 2.4 (this is torch "
             f"{torch.__version__})")

from torch.utils.checkpoint import CheckpointPolicy, checkpoint
from torch.utils.checkpoint import create_selective_checkpoint_contexts as torch_sac_contexts
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.flop_counter import FlopCounterMode

aten = torch.ops.aten
DEFAULT_OUT = os.path.join(RESULTS, "policy_fn_overhead.json")
MIN_REPS = 20
SAVE_LIST = [aten.mm.default]
VARIANTS = ("off", "full", "torch_sac_fn", "hpac_fn", "torch_sac_list", "hpac_list", "hpac_selective",
            "full_flop", "torch_sac_fn_flop", "hpac_fn_flop")
# (hpac variant, torch variant) pairs whose per-repetition ratios are reported.
PAIRS = (("hpac_fn", "torch_sac_fn"), ("hpac_list", "torch_sac_list"), ("hpac_fn_flop", "torch_sac_fn_flop"))


class CountingPolicy:
    """policy_fn: save mm outputs, recompute the rest; counts the times it is asked, per phase."""

    def __init__(self):
        self.asked = {"forward": 0, "recompute": 0}

    def __call__(self, ctx, op, *args, **kwargs):
        self.asked["recompute" if ctx.is_recompute else "forward"] += 1
        return CheckpointPolicy.MUST_SAVE if op is aten.mm.default else CheckpointPolicy.PREFER_RECOMPUTE


class Timed:
    """Wraps one context of a context_fn: the seconds from before the inner context is entered to after it exits,
    appended to `seconds` (exceptions pass through: torch's early stop of a recompute is one)."""

    def __init__(self, inner, seconds):
        self.inner, self.seconds = inner, seconds

    def __enter__(self):
        self.t = time.perf_counter()
        return self.inner.__enter__()

    def __exit__(self, *exc):
        try:
            return self.inner.__exit__(*exc)
        finally:
            self.seconds.append(time.perf_counter() - self.t)


class _CountingMode(TorchDispatchMode):
    """Counts the region's ops, and apart from them the detach torch.utils.checkpoint's recompute pack hook runs per
    saved tensor (the region itself runs none)."""

    def __init__(self):
        super().__init__()
        self.ops = 0
        self.detach = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func is aten.detach.default:
            self.detach += 1
        else:
            self.ops += 1
        return func(*args, **(kwargs or {}))


def make_region(iters):
    def region(x, w):
        h = x
        for _ in range(iters):
            h = torch.mm(h, w)
            h = h * 0.5
            h = h + x
        return h
    return region


def inner_contexts(variant, policies):
    """The variant's (forward, recompute) contexts for one checkpoint call."""
    base = variant[:-len("_flop")] if variant.endswith("_flop") else variant
    if base == "full":
        return contextlib.nullcontext(), contextlib.nullcontext()
    if base == "torch_sac_fn":
        return torch_sac_contexts(policies[variant])
    if base == "hpac_fn":
        return hpac.create_selective_checkpoint_contexts(policies[variant])
    if base == "torch_sac_list":
        return torch_sac_contexts(SAVE_LIST)
    if base == "hpac_list":
        return hpac.create_selective_checkpoint_contexts(SAVE_LIST)
    if base == "hpac_selective":
        return hpac.context_fn("selective")()
    raise ValueError(variant)


def run_once(variant, region, x0, w0, policies):
    """One forward + backward of the variant: seconds of each phase, the gradients, flops counted in backward."""
    x = x0.detach().requires_grad_()
    w = w0.detach().requires_grad_()
    fwd_region, rec = [], []

    def context_fn():
        f, r = inner_contexts(variant, policies)
        return Timed(f, fwd_region), Timed(r, rec)

    t0 = time.perf_counter()
    if variant == "off":
        out = region(x, w)
    else:
        out = checkpoint(region, x, w, use_reentrant=False, context_fn=context_fn)
    t1 = time.perf_counter()
    loss = out.sum()
    flop = FlopCounterMode(display=False) if variant.endswith("_flop") else contextlib.nullcontext()
    with flop:
        t2 = time.perf_counter()
        loss.backward()
        t3 = time.perf_counter()
    return {"forward": t1 - t0, "forward_region": sum(fwd_region) if fwd_region else None,
            "recompute": sum(rec) if rec else None, "recompute_entered": len(rec), "backward": t3 - t2,
            "grads": (x.grad, w.grad), "flops": flop.get_total_flops() if variant.endswith("_flop") else None}


def count_ops(region, x0, w0):
    """Ops dispatched in the forward and in the recompute of a full checkpoint (a counting mode inside each
    context), and in the region called plainly."""
    counters = {"forward": _CountingMode(), "recompute": _CountingMode()}

    def context_fn():
        return counters["forward"], counters["recompute"]

    x, w = x0.detach().requires_grad_(), w0.detach().requires_grad_()
    checkpoint(region, x, w, use_reentrant=False, context_fn=context_fn).sum().backward()
    plain = _CountingMode()
    with plain:
        region(x0, w0)
    return {"plain": plain.ops, "forward": counters["forward"].ops, "recompute": counters["recompute"].ops,
            "recompute_detach_by_checkpoint": counters["recompute"].detach,
            "forward_detach": counters["forward"].detach}


def summarize(times, ops):
    us = 1e6
    n_f, n_r = ops["forward"], ops["recompute"]
    out = {}
    for v in VARIANTS:
        t = times[v]
        row = {"forward_us_per_op": median(t["forward"]) / n_f * us,
               "forward_extra_over_off_us_per_op": median([a - b for a, b in zip(t["forward"], times["off"]["forward"])])
               / n_f * us,
               "backward_us_per_op": median(t["backward"]) / n_r * us,
               "backward_extra_over_off_us_per_op": median([a - b for a, b in zip(t["backward"],
                                                                             times["off"]["backward"])]) / n_r * us}
        if v != "off":
            base = "full_flop" if v.endswith("_flop") else "full"
            row["forward_region_us_per_op"] = median(t["forward_region"]) / n_f * us
            row["recompute_us_per_op"] = median(t["recompute"]) / n_r * us
            row["recompute_extra_over_full_us_per_op"] = median(
                [a - b for a, b in zip(t["recompute"], times[base]["recompute"])]) / n_r * us
            row["recompute_extra_over_plain_full_us_per_op"] = median(
                [a - b for a, b in zip(t["recompute"], times["full"]["recompute"])]) / n_r * us
        out[v] = row
    ratios = {}
    for h, p in PAIRS:
        ratios[f"{h}/{p}"] = {}
        for phase in ("forward", "recompute", "backward"):
            r = [a / b for a, b in zip(times[h][phase], times[p][phase])]
            ratios[f"{h}/{p}"][phase] = {"median": median(r), "min": min(r), "max": max(r)}
    return out, ratios


# How each figure of the JSON is measured (its "method").
METHOD = {
    "forward": "the checkpoint call, from call to return (off: the region called plainly); divided by "
               "ops.forward",
    "forward_region": "the time inside the forward context alone (entering and leaving it included)",
    "recompute": "the time inside the recompute context that torch.utils.checkpoint enters in backward: "
                 "each variant's context_fn returns its contexts wrapped in a timer (full: null contexts); "
                 "divided by ops.recompute, the region's ops the recompute reruns (counted once by a "
                 "dispatch mode inside a full checkpoint's recompute context: the recompute stops after the "
                 "last saved tensor; the detach torch's recompute pack hook runs per saved tensor, "
                 "ops.recompute_detach_by_checkpoint, is in every variant's time but not in the count)",
    "backward": "loss.backward() from call to return, recompute included; its extra over off's backward "
                "in the same repetition cross-checks the recompute figure",
    "pairing": "every repetition runs every variant `inner` times back to back (each phase keeps its "
               "fastest run), the variants' order rotated per repetition; medians over repetitions; extras "
               "and ratios are taken per repetition, then their median",
    "gc": "garbage collector disabled while a repetition runs, collected before it",
    "flop": "*_flop: a FlopCounterMode(display=False) entered around loss.backward() only; the recompute "
            "extra of a *_flop variant is over full_flop",
}


def print_tables(res):
    o = res["ops"]
    print(f"\n{o['forward']} ops in the forward, {o['recompute']} in the recompute; {res['reps']} reps; µs per op "
          "(median; extra = median of paired per-rep differences)")
    print(f"{'variant':20s}{'fwd':>8s}{'+off':>8s}{'recomp':>8s}{'+full':>8s}{'bwd':>8s}{'+off':>8s}"
          f"{'asked f/r':>12s}{'grads':>7s}")
    for v, r in res["per_op"].items():
        asked = res["policy_asked_per_call"].get(v)
        asked = f"{asked['forward']:g}/{asked['recompute']:g}" if asked else ""
        rec = (f"{r['recompute_us_per_op']:8.2f}{r['recompute_extra_over_full_us_per_op']:+8.2f}"
               if "recompute_us_per_op" in r else f"{'':8s}{'':8s}")
        print(f"{v:20s}{r['forward_us_per_op']:8.2f}{r['forward_extra_over_off_us_per_op']:+8.2f}{rec}"
              f"{r['backward_us_per_op']:8.2f}{r['backward_extra_over_off_us_per_op']:+8.2f}{asked:>12s}"
              f"{str(res['grads_bitwise_equal_off'][v]):>7s}")
    for k, r in res["ratios"].items():
        print(f"  {k}: " + ", ".join(f"{ph} {x['median']:.3f} [{x['min']:.2f}, {x['max']:.2f}]"
                                     for ph, x in r.items()))
    print(f"  flops counted in backward: {res['flops_in_backward']}")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--iters", type=int, default=200, help="loop iterations of the region (3 ops each)")
    ap.add_argument("--reps", type=int, default=30, help="timed repetitions of every variant (interleaved)")
    ap.add_argument("--inner", type=int, default=3,
                    help="back-to-back runs of a variant within a repetition; each phase keeps the fastest")
    ap.add_argument("--budget-s", type=float, default=120,
                    help=f"stop repeating once this many seconds are spent (after at least {MIN_REPS} reps, or "
                         "--reps if fewer)")
    ap.add_argument("--out", default=DEFAULT_OUT, help=f"JSON results (default {os.path.relpath(DEFAULT_OUT)})")
    a = ap.parse_args()
    if a.iters < 1 or a.reps < 1 or a.inner < 1 or a.budget_s <= 0:
        ap.error("--iters, --reps, --inner and --budget-s must be positive")
    started = time.perf_counter()
    tunables = os.environ.get("GLIBC_TUNABLES")
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, hpac key {hpac.dispatch_key()}, "
          f"GLIBC_TUNABLES={tunables or '(unset)'}")
    torch.manual_seed(0)
    x0 = torch.randn(8, 8)
    w0 = torch.eye(8) + 0.05 * torch.randn(8, 8)
    region = make_region(a.iters)
    ops = count_ops(region, x0, w0)
    policies = {v: CountingPolicy() for v in VARIANTS if "_fn" in v}
    for v in VARIANTS:
        run_once(v, region, x0, w0, policies)  # warm-up
    for p in policies.values():
        p.asked = {"forward": 0, "recompute": 0}
    calls = 0
    times = {v: {k: [] for k in ("forward", "forward_region", "recompute", "backward")} for v in VARIANTS}
    last = {}
    min_reps = min(MIN_REPS, a.reps)
    reps = 0
    gc_was = gc.isenabled()
    try:
        for r in range(a.reps):
            if r >= min_reps and time.perf_counter() - started > a.budget_s:
                break
            gc.collect()
            gc.disable()
            for v in rotated(VARIANTS, r):
                runs = [run_once(v, region, x0, w0, policies) for _ in range(a.inner)]
                last[v] = runs[-1]
                for k in times[v]:
                    times[v][k].append(None if runs[0][k] is None else min(x[k] for x in runs))
            gc.enable()
            reps += 1
            calls += a.inner
    finally:
        if gc_was:
            gc.enable()
    ref = last["off"]["grads"]
    per_op, ratios = summarize(times, ops)
    result = {
        **environment("policy_fn_overhead"),
        "command": " ".join(["python -m bench.peers.policy_fn_overhead"] + sys.argv[1:]),
        "hpac_dispatch_key": hpac.dispatch_key(),
        "region": {"iters": a.iters, "body": "h = mm(h, w); h = h * 0.5; h = h + x", "shape": [8, 8],
                   "dtype": "float32", "device": "cpu", "policy_fn": "MUST_SAVE for aten.mm.default, "
                   "PREFER_RECOMPUTE otherwise", "save_list": [str(op) for op in SAVE_LIST]},
        "ops": ops,
        "reps": reps, "reps_requested": a.reps, "inner": a.inner, "budget_s": a.budget_s,
        "method": METHOD,
        "per_op": per_op,
        "ratios": ratios,
        "policy_asked_per_call": {v: {k: n / calls for k, n in p.asked.items()} for v, p in policies.items()},
        "policy_asked_same_under_both": all(
            policies[f"hpac_{s}"].asked == policies[f"torch_sac_{s}"].asked for s in ("fn", "fn_flop")),
        "grads_bitwise_equal_off": {v: all(torch.equal(g, rg) for g, rg in zip(last[v]["grads"], ref))
                                    for v in VARIANTS},
        "flops_in_backward": {v: last[v]["flops"] for v in VARIANTS if v.endswith("_flop")},
    }
    finish(result, a.out, started)
    print_tables(result)
    print(f"\n{result['wall_s']:.0f} s; wrote {a.out}")


if __name__ == "__main__":
    main()
