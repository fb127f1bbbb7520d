"""hpac's built-in selective policy against PyTorch's own selective activation checkpointing (torch >= 2.4) running
the same policy (test/python/sac_reference.py), in one process on the same model and machine.

Step time: a stack of Qwen3-MoE-style blocks (test/python/moe_block.py), eager (bmm) and SDPA attention, each layer
under torch.utils.checkpoint.checkpoint(use_reentrant=False) with context_fn
  hpac         hpac.context_fn("selective")            (policy and cache in C++, hpac's dispatcher fallback)
  pytorch_sac  sac_reference.make_context_fn()          (create_selective_checkpoint_contexts: Python dispatch modes)
and no checkpointing ("off") for reference. Repetitions are interleaved (the order rotated every repetition); the
figure of merit is the median of the per-repetition ratios hpac/pytorch_sac, beside the median of each mode. Peak and
kept-after-forward tensor bytes come from hpac's tracking CPU allocator (installed before any tensor, for every mode
alike); the gradients of the last repetition are compared bitwise across the three modes.

Per-op cost: N torch.add on 8x8 tensors timed (i) plainly, (ii) inside an hpac region
(hpac.Invocation("full").region("forward")), (iii) inside an hpac recompute region with every add served from cache
(kernel skipped), (iv) inside PyTorch SAC's caching mode (the forward context of
create_selective_checkpoint_contexts, policy PREFER_RECOMPUTE for every op), (v) inside a do-nothing Python
TorchDispatchMode (what any Python dispatch mode costs at least); ns/op extra over (i), median of interleaved rounds
with the order rotated every round.

Step repetitions share a time budget (--budget-s; a shape past its share stops after 3 reps), so a busy machine
gets fewer repetitions instead of an endless run; every row records how many it got.

Run (about 1 minute on 2 idle cores, under 4 on a busy one) with these glibc settings, which keep malloc from
handing memory back to the OS between steps (otherwise page faults add noise to the larger steps):

    GLIBC_TUNABLES=glibc.malloc.mmap_threshold=33554432:glibc.malloc.trim_threshold=4294967296 \\
    HPAC_LIBRARY=build/plugin/libhpac.so .venv/bin/python -m bench.peers.sac_peer
"""
import argparse
import os
import statistics
import sys
import time

import torch

import hpac
from hpac.harness.compare import rotated
from hpac.harness.blocks import ATTENTION_KINDS, Block
from hpac.harness.parity import compare

from bench.common import RESULTS, environment, finish, torch_at_least

if not torch_at_least(2, 4):
    sys.exit(f"bench/peers/sac_peer.py: PyTorch's selective checkpointing needs torch >= 2.4 (this is torch "
             f"{torch.__version__})")

import hpac.harness.sac_reference as sac_reference
from hpac.harness.sac_reference import measure_step
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.checkpoint import CheckpointPolicy, create_selective_checkpoint_contexts

MODES = ("off", "hpac", "pytorch_sac")
MIN_REPS = 3
DEFAULT_OUT = os.path.join(RESULTS, "sac_peer.json")


def context_fn(mode):
    return {"off": None, "hpac": hpac.context_fn("selective"), "pytorch_sac": sac_reference.make_context_fn()}[mode]


def make_model(a, attention):
    # SDPA with dropout takes torch's math path (bmm) on CPU: dropout 0 keeps the fused CPU kernel measured.
    torch.manual_seed(0)
    return torch.nn.Sequential(*[Block(hidden=a.hidden, heads=a.heads, experts=a.experts, inter=a.inter,
                                       top_k=a.top_k, dropout=0.1 if attention == "eager" else 0.0,
                                       attention=attention) for _ in range(a.layers)])


def bench_steps(a, attention, seq, deadline):
    """Timed repetitions of the three modes on one shape: a.reps of them, fewer (at least MIN_REPS) when the
    shape's share of the time budget (deadline, a perf_counter value) runs out on a busy machine."""
    model = make_model(a, attention)
    torch.manual_seed(1)
    x0 = torch.randn(a.batch, seq, a.hidden)
    fns = {m: context_fn(m) for m in MODES}
    for m in MODES:
        measure_step(model, x0, fns[m])  # warm-up
    times = {m: [] for m in MODES}
    last = {}
    for r in range(a.reps):
        if r >= MIN_REPS and time.perf_counter() > deadline:
            break
        for m in rotated(MODES, r):
            last[m] = measure_step(model, x0, fns[m])
            times[m].append(last[m].seconds)
    ref_grads = last["off"].grads
    row = {"attention": attention, "seq": seq, "dropout": model[0].self_attn.dropout, "reps": len(times["hpac"])}
    for m in MODES:
        r = last[m]
        row[m] = {"ms_median": statistics.median(times[m]) * 1e3, "peak_bytes": r.peak_bytes,
                  "kept_bytes": r.kept_bytes,
                  "grads_bitwise_equal_off": compare(r.grads, ref_grads)[0] == 0}  # NaN never equal
    ratios = [h / s for h, s in zip(times["hpac"], times["pytorch_sac"])]
    row["time_ratio_hpac_over_pytorch_sac"] = {"median": statistics.median(ratios), "min": min(ratios),
                                               "max": max(ratios)}
    row["kept_ratio_hpac_over_pytorch_sac"] = row["hpac"]["kept_bytes"] / row["pytorch_sac"]["kept_bytes"]
    return row


class _NoOpMode(TorchDispatchMode):
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        return func(*args, **(kwargs or {}))


def bench_per_op(n, rounds):
    a, b = torch.ones(8, 8), torch.ones(8, 8)

    def loop():
        for _ in range(n):
            torch.add(a, b)

    def plain():
        t = time.perf_counter()
        loop()
        return time.perf_counter() - t

    def hpac_region():
        inv = hpac.Invocation("full")
        t = time.perf_counter()
        with inv.region("forward"):
            loop()
        return time.perf_counter() - t

    def hpac_serve():
        inv = hpac.Invocation(["aten::add.Tensor"])
        with inv.region("forward"):
            loop()
        t = time.perf_counter()
        with inv.region("recompute"):
            loop()
        return time.perf_counter() - t

    def python_mode():
        t = time.perf_counter()
        with _NoOpMode():
            loop()
        return time.perf_counter() - t

    def recompute_everything(ctx, op, *args, **kwargs):
        return CheckpointPolicy.PREFER_RECOMPUTE

    def sac_caching_mode():
        forward, _ = create_selective_checkpoint_contexts(recompute_everything)
        t = time.perf_counter()
        with forward:
            loop()
        return time.perf_counter() - t

    variants = {"plain": plain, "hpac_region": hpac_region, "hpac_serve": hpac_serve,
                "pytorch_sac_caching_mode": sac_caching_mode, "python_noop_mode": python_mode}
    for fn in variants.values():
        fn()  # warm-up
    ns = {k: [] for k in variants}
    for r in range(rounds):
        for name in rotated(list(variants), r):
            ns[name].append(variants[name]() / n * 1e9)
    med = {k: statistics.median(v) for k, v in ns.items()}
    return {"ops_per_round": n, "rounds": rounds, "op": "torch.add 8x8 float32", "ns_per_op_median": med,
            "extra_ns_per_op_over_plain": {k: med[k] - med["plain"] for k in variants if k != "plain"}}


def print_tables(result):
    print(f"\n{'attention':9s}{'seq':>6s}{'mode':>13s}{'step ms':>10s}{'peak MiB':>10s}{'kept MiB':>10s}"
          f"{'grads==off':>11s}")
    for row in result["steps"]:
        for m in MODES:
            r = row[m]
            print(f"{row['attention']:9s}{row['seq']:6d}{m:>13s}{r['ms_median']:10.2f}{r['peak_bytes'] / 2**20:10.3f}"
                  f"{r['kept_bytes'] / 2**20:10.3f}{str(r['grads_bitwise_equal_off']):>11s}")
        t = row["time_ratio_hpac_over_pytorch_sac"]
        print(f"{'':15s}{row['reps']} reps; time hpac/pytorch_sac: median of per-rep ratios {t['median']:.3f} "
              f"[min {t['min']:.3f}, max {t['max']:.3f}]; kept bytes hpac/pytorch_sac "
              f"{row['kept_ratio_hpac_over_pytorch_sac']:.4f}")
    p = result["per_op"]
    print(f"\nper op ({p['ops_per_round']} x {p['op']}, {p['rounds']} rounds, median ns/op):")
    for k, v in p["ns_per_op_median"].items():
        extra = p["extra_ns_per_op_over_plain"].get(k)
        print(f"  {k:26s}{v:9.0f}" + ("" if extra is None else f"   +{extra:.0f} over plain"))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seqs", default="32,512,1024", help="comma-separated sequence lengths")
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--hidden", type=int, default=128)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--experts", type=int, default=4)
    ap.add_argument("--inter", type=int, default=192)
    ap.add_argument("--top-k", type=int, default=2)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--threads", type=int, help="torch intra-op threads (default: torch's own choice)")
    ap.add_argument("--reps", type=int, default=15, help="timed repetitions per mode and shape")
    ap.add_argument("--budget-s", type=float, default=150,
                    help="seconds for all step benchmarks together: a shape whose even share is spent stops "
                         f"repeating (after at least {MIN_REPS} reps)")
    ap.add_argument("--op-count", type=int, default=2000, help="small ops per round of the per-op benchmark")
    ap.add_argument("--op-rounds", type=int, default=30)
    ap.add_argument("--out", default=DEFAULT_OUT, help=f"JSON results (default {os.path.relpath(DEFAULT_OUT)})")
    a = ap.parse_args()
    seqs = [int(s) for s in a.seqs.split(",")]
    if min([a.layers, a.hidden, a.heads, a.experts, a.inter, a.top_k, a.batch, a.reps, a.op_count, a.op_rounds,
            a.budget_s] + seqs) <= 0:
        ap.error("every size and count must be a positive integer")
    if a.threads is not None:
        if a.threads < 1:
            ap.error("--threads must be a positive integer")
        torch.set_num_threads(a.threads)
    hpac.track_memory()  # before any tensor measured here exists
    started = time.perf_counter()
    tunables = os.environ.get("GLIBC_TUNABLES")
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, {a.layers} layers, hidden {a.hidden}, "
          f"batch {a.batch}, fp32 CPU, {a.reps} reps, GLIBC_TUNABLES={tunables or '(unset)'}")
    shapes = [(attention, seq) for attention in ATTENTION_KINDS for seq in seqs]
    steps = []
    for i, (attention, seq) in enumerate(shapes):
        steps.append(bench_steps(a, attention, seq, started + a.budget_s * (i + 1) / len(shapes)))
    result = {
        **environment("sac_peer"), "command": " ".join(["python -m bench.peers.sac_peer"] + sys.argv[1:]),
        "hpac_dispatch_key": hpac.dispatch_key(),
        "model": {"layers": a.layers, "hidden": a.hidden, "heads": a.heads, "experts": a.experts, "inter": a.inter,
                  "top_k": a.top_k, "batch": a.batch, "dtype": "float32", "device": "cpu"},
        "reps_requested": a.reps, "budget_s": a.budget_s, "steps": steps,
        "per_op": bench_per_op(a.op_count, a.op_rounds),
    }
    finish(result, a.out, started)
    print_tables(result)
    print(f"\n{result['wall_s']:.0f} s; wrote {a.out}")


if __name__ == "__main__":
    main()
