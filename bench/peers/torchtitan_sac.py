"""torchtitan's selective activation checkpointing as its users run it, against the same rules run by hpac, on
torchtitan's own Qwen3-MoE debug model (CPU, small): kept bytes after forward, peak bytes, step time, max gradient
difference against no checkpointing.

Variants (each its own copy of one model, same weights; one interleaved run, the order rotated every step):
  off               no activation checkpointing
  torchtitan        torchtitan 0.3.0's own SelectiveAC(SelectiveAC.Config()).apply(model): its policy_fn through
                    torch's SAC (torch.utils.checkpoint.create_selective_checkpoint_contexts)
  hpac_torchtitan   hpac.torchtitan.apply_ac(model, SelectiveAC.Config()): the same rules as hpac's C++ kind
                    `torchtitan` (policy/field_policies.h), no Python per op
  hpac_policy_fn    torchtitan's own SelectiveAC with its create_selective_checkpoint_contexts swapped for hpac's: the
                    same Python policy_fn, asked by hpac once per op in the forward, replayed in C++
  hpac_selective    hpac.torchtitan.apply_ac(model, Config(mode="selective")): hpac's built-in rules
  hpac_budget       hpac.torchtitan.apply_ac(model, Config(mode="budget", memory_budget=0.5)): hpac's eager budget

The model: torchtitan's `debugmodel_moe` (dim 256, 16 heads, 8 KV heads, head_dim 128, MoE hidden 768, vocab 2048)
with 4 layers and 8 experts top-2 instead of 8 layers and 64 experts top-8 (CPU time), and each block's inner
attention causal SDPA instead of FlexAttention: torchtitan 0.3.0 accepts only flex / flex_flash / varlen for language
models, and FlexAttention has no backward on CPU. torchtitan's expert-parallel kernels import triton at import time;
the benchmark stands in a module that fails if called (a single-process CPU run calls none).

Per step and variant: bytes left allocated by the forward (hpac's tracking CPU allocator), peak bytes during forward
and backward above the step's start, forward + backward wall time, max |grad - off's grad| over every parameter. Two
warm-up steps per variant are not counted (the budget profiles in the first). Gradients are allocated before the
first step (zeroed each step), so they are part of every variant's starting set, not of its peak. Figures are medians over steps; ratios are taken
within a step (paired) before the median.

Run (about 3 min on 2 cores) with the glibc settings the other benchmarks use (the script re-executes itself with
them when GLIBC_TUNABLES is unset, and records them):

    GLIBC_TUNABLES=glibc.malloc.mmap_threshold=33554432:glibc.malloc.trim_threshold=4294967296 \\
    HPAC_LIBRARY=build/plugin/libhpac.so .venv/bin/python -m bench.peers.torchtitan_sac
"""
import argparse
import copy
import warnings
import gc
import os
import statistics
import sys
import time
import types

from bench.common import GLIBC_TUNABLES, RESULTS, environment, module_command, write_json

if __name__ == "__main__" and "GLIBC_TUNABLES" not in os.environ:  # the allocator setting, before the allocator starts
    os.environ["GLIBC_TUNABLES"] = GLIBC_TUNABLES
    os.execv(sys.executable, module_command("bench.peers.torchtitan_sac", *sys.argv[1:]))

import torch
import torch.nn.functional as F

import hpac
import hpac.torchtitan as hpac_tt
from hpac.harness.compare import rotated

VARIANTS = ("off", "torchtitan", "hpac_torchtitan", "hpac_policy_fn", "hpac_selective", "hpac_budget")


def _without_triton():
    """torchtitan.models.common.token_dispatcher imports torchtitan's minimal_async_ep, whose kernels import triton
    (not installed: a 1 GB wheel for kernels a CPU run never calls). A stand-in module that fails if used."""
    def stand_in(*args, **kwargs):
        raise RuntimeError("bench/peers/torchtitan_sac.py: torchtitan's minimal_async_ep kernels need triton")
    ep = types.ModuleType("torchtitan.distributed.minimal_async_ep")
    for name in ("combine_op", "dispatch_op", "init_buffer", "maybe_update_minimal_async_ep_config"):
        setattr(ep, name, stand_in)
    ep.MinimalAsyncEPDispatchMetadata = type("MinimalAsyncEPDispatchMetadata", (), {})
    sys.modules.setdefault("torchtitan.distributed.minimal_async_ep", ep)


def _sdpa(q_BLNH, k_BLNH, v_BLNH, *, attention_masks=None, scale=None, enable_gqa=False, **kwargs):
    out = F.scaled_dot_product_attention(q_BLNH.transpose(1, 2), k_BLNH.transpose(1, 2), v_BLNH.transpose(1, 2),
                                         is_causal=True, scale=scale, enable_gqa=enable_gqa)
    return out.transpose(1, 2)


def build_model(layers, experts, top_k, seed):
    _without_triton()
    import torchtitan.models.qwen3 as qwen3
    from torchtitan.models.common.rope import CosSinRoPE
    cfg = qwen3._debugmodel_moe("flex")
    cfg.layers = qwen3._build_qwen3_moe_layers(
        n_layers=layers, dim=256, n_heads=16, n_kv_heads=8, head_dim=128, moe_hidden_dim=768, num_experts=experts,
        top_k=top_k, attn_backend="flex", moe_comm_backend="standard",
        rope=CosSinRoPE.Config(dim=128, max_seq_len=4096, theta=1000000.0))
    torch.manual_seed(seed)
    model = cfg.build()
    model.init_weights()
    for block in model.layers.values():
        block.attention.inner_attention.forward = _sdpa
    model.train()
    return model


def apply(variant, model):
    from torchtitan.distributed import activation_checkpoint as tt
    if variant == "off":
        return model
    if variant == "torchtitan":
        tt.SelectiveAC(tt.SelectiveAC.Config()).apply(model)
    elif variant == "hpac_torchtitan":
        hpac_tt.apply_ac(model, tt.SelectiveAC.Config())
    elif variant == "hpac_policy_fn":
        real = tt.create_selective_checkpoint_contexts
        tt.create_selective_checkpoint_contexts = hpac.create_selective_checkpoint_contexts
        try:
            tt.SelectiveAC(tt.SelectiveAC.Config()).apply(model)  # the lambda looks the name up per call: see step
        finally:
            tt.create_selective_checkpoint_contexts = real
        model._hpac_policy_fn = True
    elif variant == "hpac_selective":
        hpac_tt.apply_ac(model, hpac_tt.Config(mode="selective"))
    elif variant == "hpac_budget":
        hpac_tt.apply_ac(model, hpac_tt.Config(mode="budget", memory_budget=0.5))
    return model


def tokens(step, batch, seq):
    g = torch.Generator().manual_seed(1000 + step)
    return torch.randint(0, 2048, (batch, seq), generator=g)


def run_step(variant, model, ids):
    """(kept bytes after forward, peak bytes above the start, seconds, grads)."""
    from torchtitan.distributed import activation_checkpoint as tt
    for p in model.parameters():
        p.grad.zero_()  # allocated before the first step: every step and variant starts from the same resident set
    gc.collect()
    real = tt.create_selective_checkpoint_contexts
    if getattr(model, "_hpac_policy_fn", False):  # torchtitan's context_fn looks the function up at each call
        tt.create_selective_checkpoint_contexts = hpac.create_selective_checkpoint_contexts
    try:
        base = hpac.cpu_tensor_memory_stats()["current_bytes"]
        hpac.reset_cpu_tensor_peak()
        t0 = time.perf_counter()
        out = model(ids)
        kept = hpac.cpu_tensor_memory_stats()["current_bytes"] - base
        loss = F.cross_entropy(out.flatten(0, 1).float(), ids.roll(-1, 1).flatten())
        loss.backward()
        seconds = time.perf_counter() - t0
        peak = hpac.cpu_tensor_memory_stats()["peak_bytes"] - base
    finally:
        tt.create_selective_checkpoint_contexts = real
    return kept, peak, seconds, [p.grad.detach().clone() for p in model.parameters()]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--experts", type=int, default=8)
    ap.add_argument("--top-k", type=int, default=2)
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--seq", type=int, default=256)
    ap.add_argument("--out", default=os.path.join(RESULTS, "torchtitan_sac.json"))
    args = ap.parse_args()
    import torchtitan

    # torchtitan's MoE counts tokens per expert into a buffer in its forward, which every recompute counts again
    # (under torch's SAC too); hpac warns about it once per layer (Note [State written twice]). Its router casts
    # under a float32 CPU autocast, which torch warns it disables.
    warnings.filterwarnings("ignore", message=".*writes a .* tensor in place, a tensor from outside")
    warnings.filterwarnings("ignore", message=".*CPU autocast.*|.*In CPU autocast.*")
    hpac.track_memory()
    reference = build_model(args.layers, args.experts, args.top_k, seed=0)
    models = {v: apply(v, copy.deepcopy(reference)) for v in VARIANTS}
    del reference
    for model in models.values():
        for p in model.parameters():
            p.grad = torch.zeros_like(p)
    rows = {v: {"kept": [], "peak": [], "seconds": [], "max_grad_diff": [], "bitwise": []} for v in VARIANTS}
    for step in range(-args.warmup + 1, args.steps + 1):
        ids = tokens(step, args.batch, args.seq)
        results = {}
        for v in rotated(VARIANTS, step):
            results[v] = run_step(v, models[v], ids)
        if step <= 0:
            continue  # warm-up: the budget profiles in the first
        off_grads = results["off"][3]
        for v, (kept, peak, seconds, grads) in results.items():
            diff = max((g.double() - o.double()).abs().max().item() for g, o in zip(grads, off_grads))
            r = rows[v]
            r["kept"].append(kept)
            r["peak"].append(peak)
            r["seconds"].append(seconds)
            r["max_grad_diff"].append(diff)
            r["bitwise"].append(all(torch.equal(g, o) for g, o in zip(grads, off_grads)))
        print(f"step {step}: " + ", ".join(f"{v} {results[v][2]:.3f}s" for v in VARIANTS), flush=True)

    def ratio(v, base, key):
        return statistics.median(a / b for a, b in zip(rows[v][key], rows[base][key]))

    summary = {}
    for v in VARIANTS:
        r = rows[v]
        summary[v] = {
            "kept_bytes": statistics.median(r["kept"]), "peak_bytes": statistics.median(r["peak"]),
            "step_seconds": statistics.median(r["seconds"]), "max_grad_diff": max(r["max_grad_diff"]),
            "grads_bitwise_equal_off": all(r["bitwise"]),
            "time_vs_off": ratio(v, "off", "seconds"), "time_vs_torchtitan": ratio(v, "torchtitan", "seconds"),
            "kept_vs_off": ratio(v, "off", "kept"), "peak_vs_off": ratio(v, "off", "peak"),
        }
    data = {
        **environment("torchtitan_sac"), "torchtitan": torchtitan.__version__, "hpac_dispatch_key": hpac.dispatch_key(),
        "model": {"name": "torchtitan qwen3 debugmodel_moe", "layers": args.layers, "experts": args.experts,
                  "top_k": args.top_k, "dim": 256, "heads": 16, "kv_heads": 8, "head_dim": 128,
                  "moe_hidden_dim": 768, "vocab": 2048, "attention": "causal SDPA (flex has no CPU backward)",
                  "params": sum(p.numel() for p in models["off"].parameters())},
        "batch": args.batch, "seq": args.seq, "steps": args.steps, "warmup": args.warmup, "variants": list(VARIANTS),
        "per_step": rows, "summary": summary,
    }
    write_json(args.out, data)
    for v, s in summary.items():
        print(f"{v:16s} kept {s['kept_bytes'] / 2**20:7.2f} MiB  peak {s['peak_bytes'] / 2**20:7.2f} MiB  "
              f"step {s['step_seconds'] * 1e3:7.1f} ms  x off {s['time_vs_off']:.2f}  x torchtitan "
              f"{s['time_vs_torchtitan']:.2f}  max|dgrad| {s['max_grad_diff']:.3g}")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
