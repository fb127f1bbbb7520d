"""hpac's built-in selective policy written for PyTorch's own selective activation checkpointing (torch >= 2.4):
the peer hpac is compared against in test/python/test_peer_sac.py and bench/peers/sac_peer.py.

    from torch.utils.checkpoint import checkpoint
    y = checkpoint(block, x, use_reentrant=False, context_fn=sac_reference.make_context_fn())

measure_step() runs one training step of a layer stack under any context_fn (hpac's, this one's, or none) and
reports time, peak and kept bytes and the gradients; the test and the benchmark both use it.

The op tables mirror policy/op_tables.cpp entry for entry (test_peer_sac.py checks that against the C++ source);
"ns::op" names every overload, "ns::op.overload" one ("default" = the overload with the empty name). The rules, in
the order hpac checks them:
  hpac's ignored ops      -> PREFER_RECOMPUTE, not counted as matmuls. PyTorch's SAC skips only its own
                             SAC_IGNORED_OPS (detach, prim::device, tensor metadata) before asking the policy; the
                             rest of hpac's list (views, empty, copy_, profiler and FSDP lifecycle ops) is asked
                             about and recomputed, which keeps nothing more.
  aten::topk              -> MUST_RECOMPUTE (routers divide the topk values in place).
  matmul family           -> 1st, 3rd, 5th... call MUST_SAVE, 2nd, 4th... MUST_RECOMPUTE, counted per checkpoint
                             call. On torch 2.x the policy is asked in the forward only (ctx.is_recompute is always
                             False) and the recompute replays the forward's decisions by per-op index, so one
                             forward counter per call is all there is (hpac counts per phase and gets the same).
  save set                -> MUST_SAVE (compute-intensive ops, attention kernels, aten::max, collectives).
  everything else         -> PREFER_RECOMPUTE.
Ops missing from this torch (optional entries in op_tables.cpp) simply never arrive.
"""
import collections
import functools
import gc
import time

import torch
from torch.utils.checkpoint import CheckpointPolicy, checkpoint, create_selective_checkpoint_contexts

import hpac

__all__ = ["IGNORED_OPS", "RECOMPUTE_OPS", "MATMUL_OPS", "SAVE_OPS", "category", "SelectivePolicy",
           "make_context_fn", "StepResult", "measure_step"]

# policy/op_tables.cpp kIgnoredOps.
IGNORED_OPS = frozenset({
    "aten::_chunk_cat", "aten::copy_.default", "aten::detach", "aten::empty.memory_format", "aten::empty_like",
    "aten::split_with_sizes_copy", "aten::view.default", "c10d::_allgather_base_", "fsdp::all_gather_copy_in",
    "fsdp::chunk_cat", "fsdp::split_with_sizes_copy", "hpac::sdp_choice", "prim::device",
    "profiler::_record_function_enter",
    "profiler::_record_function_enter_new", "profiler::_record_function_exit",
})
# policy/op_tables.cpp kRecomputeOps.
RECOMPUTE_OPS = frozenset({"aten::topk"})
# policy/op_tables.cpp kMatmulOps.
MATMUL_OPS = frozenset({"aten::_grouped_mm", "aten::_scaled_grouped_mm", "aten::linear", "aten::matmul", "aten::mm"})
# policy/op_tables.cpp kSaveOps.
SAVE_OPS = frozenset({
    "_c10d_functional::all_gather_into_tensor", "_c10d_functional::all_gather_into_tensor_coalesced",
    "_c10d_functional::all_reduce", "_c10d_functional::all_reduce_coalesced", "_c10d_functional::all_to_all_single",
    "_c10d_functional::reduce_scatter_tensor", "_c10d_functional::reduce_scatter_tensor_coalesced",
    "_c10d_functional::wait_tensor",
    "aten::_convolution", "aten::_efficient_attention_forward", "aten::_flash_attention_forward",
    "aten::_flash_scaled_dot_product_attention", "aten::_scaled_dot_product_attention_math",
    "aten::_scaled_dot_product_cudnn_attention", "aten::_scaled_dot_product_efficient_attention",
    "aten::_scaled_dot_product_flash_attention", "aten::_scaled_dot_product_flash_attention_for_cpu",
    "aten::_scaled_mm", "aten::addmm", "aten::baddbmm", "aten::bmm", "aten::convolution", "aten::cudnn_convolution",
    "aten::max", "aten::mkldnn_convolution",
    "c10d::allreduce_", "c10d::alltoall_", "c10d::alltoall_base_", "c10d::recv_", "c10d::reduce_scatter_",
    "c10d::reduce_scatter_tensor_coalesced_", "c10d::send",
    "npu::npu_fusion_attention",
})

# In op_tables.cpp's order: an op named by two tables keeps the first one's category.
_TABLES = (("ignored", IGNORED_OPS), ("recompute", RECOMPUTE_OPS), ("matmul", MATMUL_OPS), ("save", SAVE_OPS))


@functools.lru_cache(maxsize=None)
def category(op):
    """'ignored' | 'recompute' | 'matmul' | 'save' | 'other' for an OpOverload, as hpac's op tables classify it."""
    return category_of(op._schema.name, op._overloadname)


@functools.lru_cache(maxsize=None)
def category_of(name, overload="default"):
    """category() by name: `name` "aten::mm", `overload` "default" for the overload with the empty name."""
    for kind, table in _TABLES:
        if name in table or f"{name}.{overload}" in table:
            return kind
    return "other"


class SelectivePolicy:
    """The policy_fn of one checkpoint call (it holds that call's matmul counter).

    matmul_period: every matmul_period-th matmul call, starting with the first, is saved (2 = hpac's rule);
    tests set 1 to get a deliberately different policy. log: when a list, (op name as hpac's op log writes it, e.g.
    "aten::mm" or "aten::mul.Tensor", saved) is appended for every op the policy is asked about.
    """

    def __init__(self, matmul_period=2, log=None):
        self.matmul_period = matmul_period
        self.matmuls = 0
        self.log = log

    def decide(self, op):
        kind = category(op)
        if kind == "recompute":
            return CheckpointPolicy.MUST_RECOMPUTE
        if kind == "matmul":
            n = self.matmuls
            self.matmuls += 1
            return CheckpointPolicy.MUST_SAVE if n % self.matmul_period == 0 else CheckpointPolicy.MUST_RECOMPUTE
        if kind == "save":
            return CheckpointPolicy.MUST_SAVE
        return CheckpointPolicy.PREFER_RECOMPUTE

    def __call__(self, ctx, op, *args, **kwargs):
        policy = self.decide(op)
        if self.log is not None:
            overload = "" if op._overloadname == "default" else "." + op._overloadname
            self.log.append((op._schema.name + overload, policy == CheckpointPolicy.MUST_SAVE))
        return policy


def make_context_fn(**policy_kwargs):
    """A context_fn for torch.utils.checkpoint.checkpoint(..., use_reentrant=False): every checkpoint call gets
    its own SelectivePolicy(**policy_kwargs) (a fresh matmul counter) and PyTorch's (caching, cached) modes."""

    def context_fn():
        return create_selective_checkpoint_contexts(SelectivePolicy(**policy_kwargs))

    return context_fn


StepResult = collections.namedtuple("StepResult", "seconds peak_bytes kept_bytes grads")


def measure_step(layers, x0, context_fn=None, seed=3):
    """One training step (loss = mean of squares) of `layers` applied in turn to a copy of x0, each layer under
    torch.utils.checkpoint.checkpoint(use_reentrant=False, context_fn=context_fn); context_fn None: no checkpointing.

    The RNG is seeded with `seed` first (the same dropout masks in every run). Bytes come from hpac's tracking CPU
    allocator (hpac.track_memory() must have been called before the tensors exist): kept = alive after forward,
    before backward; peak = over the step; both above the step's start. Python's cyclic GC is collected before and
    paused during the step, so neither figure depends on when it happens to run. grads = [x grad] + parameter grads.
    """
    for layer in layers:
        layer.zero_grad(set_to_none=True)
    x = x0.clone().requires_grad_(True)
    torch.manual_seed(seed)
    gc.collect()
    gc_was_enabled = gc.isenabled()
    gc.disable()
    try:
        base = hpac.cpu_tensor_memory_stats()["current_bytes"]
        hpac.reset_cpu_tensor_peak()
        t0 = time.perf_counter()
        h = x
        for layer in layers:
            h = layer(h) if context_fn is None else checkpoint(layer, h, use_reentrant=False, context_fn=context_fn)
        loss = h.pow(2).mean()
        kept = hpac.cpu_tensor_memory_stats()["current_bytes"] - base
        loss.backward()
        seconds = time.perf_counter() - t0
        peak = hpac.cpu_tensor_memory_stats()["peak_bytes"] - base
    finally:
        if gc_was_enabled:
            gc.enable()
    return StepResult(seconds, peak, kept, [x.grad] + [p.grad for layer in layers for p in layer.parameters()])
