"""Side-by-side peer harness: the same Qwen3-MoE-style model, shapes and machine, one process, modes interleaved.

  off        no checkpointing
  torch_full torch.utils.checkpoint.checkpoint(use_reentrant=False) per layer (full)
  py_sac     SAC as a Python TorchDispatchMode with hpac's selective policy (the caching/cached-mode algorithm of
             PyTorch's own SAC, written here because torch 1.13 lacks it); on torch >= 2.4 PyTorch's own
             create_selective_checkpoint_contexts with the same policy instead
  hpac       hpac's selective policy in C++ through torch.ops.load_library (hpac.checkpoint on torch < 2.1,
             torch's checkpoint with hpac.context_fn on newer torch)

Reports median step time, peak and kept-after-forward tensor bytes (hpac's tracking CPU allocator, installed for
every mode alike) and the ratios hpac/py_sac and hpac/torch_full. Writes JSON with --out.

    GLIBC_TUNABLES=glibc.malloc.mmap_threshold=33554432:glibc.malloc.trim_threshold=4294967296 \\
    HPAC_LIBRARY=build/plugin/libhpac.so PYTHONPATH=plugin/python:. /usr/bin/python3 -m bench.peers.peer_harness
"""
import argparse
import collections
import contextlib
import json
import os
import statistics
import time

import torch

from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_map
from torch.utils.checkpoint import checkpoint as torch_checkpoint

import hpac
from hpac.harness import checkpoint_with
from hpac.harness.blocks import Block
from hpac.harness.parity import compare

from bench.common import environment, torch_at_least

aten = torch.ops.aten


def _packets(*names):
    return {getattr(aten, n) for n in names if hasattr(aten, n)}


# hpac's built-in selective policy, as Python sets (policy/op_tables.cpp is the source of truth).
RECOMPUTE = _packets("topk")
MATMUL = _packets("mm", "matmul", "linear", "_grouped_mm", "_scaled_grouped_mm")
SAVE = _packets("addmm", "bmm", "baddbmm", "convolution", "_convolution", "mkldnn_convolution", "max", "_scaled_mm",
                "_scaled_dot_product_attention_math", "_scaled_dot_product_flash_attention",
                "_scaled_dot_product_efficient_attention", "_scaled_dot_product_cudnn_attention",
                "_flash_scaled_dot_product_attention")
IGNORED = {aten.detach.default, aten.copy_.default, aten.view.default, aten.empty.memory_format, aten.empty_like.default}


def selective_decision(func, counters, is_recompute):
    """True = save. counters: per invocation, per phase matmul count."""
    packet = func.overloadpacket
    if packet in RECOMPUTE:
        return False
    if packet in MATMUL:
        n = counters[is_recompute]
        counters[is_recompute] += 1
        return n % 2 == 0
    return packet in SAVE


class PySacInvocation:
    """One checkpoint call of the Python-mode SAC: storage per op (FIFO, as PyTorch's caching mode), per-phase counters."""

    def __init__(self):
        self.storage = collections.defaultdict(list)
        self.counters = [0, 0]
        self.id = 0

    @contextlib.contextmanager
    def region(self, phase):
        self.counters[phase == "recompute"] = 0
        with (_CachingMode(self) if phase == "forward" else _CachedMode(self)):
            yield self


def _plain_call(func, args, kwargs):
    # torch 1.13's Python modes hand wrapped-number tensors (a Python scalar operand saved by autograd) to
    # __torch_dispatch__ as Python floats; detach of such a value is the value as a tensor.
    if func is aten.detach.default and not isinstance(args[0], torch.Tensor):
        v = args[0]
        return torch.tensor(v, dtype=torch.float64 if isinstance(v, float) else torch.int64)
    return func(*args, **(kwargs or {}))


class _CachingMode(TorchDispatchMode):
    def __init__(self, inv):
        super().__init__()
        self.inv = inv

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = _plain_call(func, args, kwargs)
        if func not in IGNORED and selective_decision(func, self.inv.counters, False):
            self.inv.storage[func].append(tree_map(lambda x: x.detach() if isinstance(x, torch.Tensor) else x, out))
        return out


class _CachedMode(TorchDispatchMode):
    def __init__(self, inv):
        super().__init__()
        self.inv = inv

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func not in IGNORED and selective_decision(func, self.inv.counters, True):
            return self.inv.storage[func].pop(0)
        return _plain_call(func, args, kwargs)


def layer_call(mode):
    if mode == "off":
        return lambda block, h: block(h)
    if mode == "torch_full":
        return lambda block, h: torch_checkpoint(block, h, use_reentrant=False)
    if mode == "py_sac":
        if torch_at_least(2, 4):
            from torch.utils.checkpoint import CheckpointPolicy, create_selective_checkpoint_contexts

            def make_ctx():
                counters = [0, 0]

                def policy_fn(ctx, func, *args, **kwargs):
                    save = func not in IGNORED and selective_decision(func, counters, ctx.is_recompute)
                    return CheckpointPolicy.MUST_SAVE if save else CheckpointPolicy.PREFER_RECOMPUTE
                return create_selective_checkpoint_contexts(policy_fn)
            return lambda block, h: torch_checkpoint(block, h, use_reentrant=False, context_fn=make_ctx)
        return lambda block, h: checkpoint_with(PySacInvocation(), block, h)
    if mode == "hpac":
        if torch_at_least(2, 1):
            return lambda block, h: torch_checkpoint(block, h, use_reentrant=False, context_fn=hpac.context_fn("selective"))
        return lambda block, h: hpac.checkpoint(block, h, policy="selective")
    raise ValueError(mode)


def step(model, x, mode):
    call = layer_call(mode)
    model.zero_grad(set_to_none=True)
    torch.manual_seed(0)
    base = hpac.cpu_tensor_memory_stats()["current_bytes"]
    hpac.reset_cpu_tensor_peak()
    t0 = time.perf_counter()
    h = x
    for block in model:
        h = call(block, h)
    loss = h.float().pow(2).mean()
    kept = hpac.cpu_tensor_memory_stats()["current_bytes"] - base
    loss.backward()
    elapsed = time.perf_counter() - t0
    peak = hpac.cpu_tensor_memory_stats()["peak_bytes"] - base
    return elapsed, peak, kept, loss.item(), [p.grad.clone() for p in model.parameters()]


MODES = ["off", "torch_full", "py_sac", "hpac"]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seqs", default="256,512,1024", help="comma-separated sequence lengths")
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--hidden", type=int, default=128)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--out", help="write the results as JSON here")
    a = ap.parse_args()
    seqs = [int(s) for s in a.seqs.split(",")]
    if a.layers < 1 or a.reps < 1 or any(s < 1 for s in seqs):
        ap.error("--layers, --reps and every --seqs entry must be positive integers")
    hpac.track_memory()
    torch.manual_seed(0)
    model = torch.nn.Sequential(*[Block(hidden=a.hidden, heads=4, experts=4, inter=a.hidden * 3 // 2, top_k=2)
                                  for _ in range(a.layers)])
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, layers {a.layers}, hidden {a.hidden}, "
          f"batch 1, fp32 CPU, reps {a.reps}, GLIBC_TUNABLES={os.environ.get('GLIBC_TUNABLES', '(unset)')}")
    results = []
    for seq in seqs:
        torch.manual_seed(1)
        x = torch.randn(1, seq, a.hidden, requires_grad=True)
        times = collections.defaultdict(list)
        last = {}
        for m in MODES:
            step(model, x, m)  # warm-up
        for _ in range(a.reps):
            for m in MODES:
                t, peak, kept, loss, grads = step(model, x, m)
                times[m].append(t)
                last[m] = (peak, kept, loss, grads)
        row = {"seq": seq, "layers": a.layers, "hidden": a.hidden}
        ref_grads = last["off"][3]
        for m in MODES:
            peak, kept, loss, grads = last[m]
            row[m] = {"ms": statistics.median(times[m]) * 1e3, "peak_MiB": peak / 2**20, "kept_MiB": kept / 2**20,
                      "loss": loss,
                      "max_grad_diff": compare(grads, ref_grads)[0]}  # inf on NaN/Inf
        # Paired ratios: medians of per-repetition ratios.
        row["hpac_vs_py_sac_time"] = statistics.median(h / p for h, p in zip(times["hpac"], times["py_sac"]))
        row["hpac_vs_torch_full_time"] = statistics.median(h / p for h, p in zip(times["hpac"], times["torch_full"]))
        row["hpac_vs_off_time"] = statistics.median(h / p for h, p in zip(times["hpac"], times["off"]))
        results.append(row)
        print(f"\nseq {seq}:")
        print(f"  {'mode':11s}{'step ms':>10s}{'peak MiB':>10s}{'kept MiB':>10s}{'max|dgrad|':>12s}")
        for m in MODES:
            r = row[m]
            print(f"  {m:11s}{r['ms']:10.1f}{r['peak_MiB']:10.2f}{r['kept_MiB']:10.2f}{r['max_grad_diff']:12.2e}")
        print(f"  time ratios: hpac/py_sac {row['hpac_vs_py_sac_time']:.3f}, hpac/torch_full "
              f"{row['hpac_vs_torch_full_time']:.3f}, hpac/off {row['hpac_vs_off_time']:.3f}")
    if a.out:
        with open(a.out, "w") as f:
            json.dump({**environment("peer_harness"), "results": results}, f, indent=1)


if __name__ == "__main__":
    main()
