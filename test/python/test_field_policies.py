"""Policies from the field as C++ kinds (policy/field_policies.h): each keeps exactly what the same rules keep through
torch's own SAC — the same list of (op, occurrence) saved per layer and the same bytes after forward — and gives
gradients bitwise equal to no checkpointing, on a tiny random-weight transformers Qwen3-MoE (nothing downloaded).

The torch side runs the rules as Python policy functions through torch.utils.checkpoint's
create_selective_checkpoint_contexts: torchtitan 0.3.0's SelectiveAC policy ported line by line (torchtitan is not
needed here; test_torchtitan_adapter.py runs torchtitan's own code), and the obvious functions for save_all_but and
save_occurrences. transformers' Qwen3-MoE router renormalises the top-k values in place (norm_topk_prob), which
torch's SAC refuses when topk is saved ("... has been mutated"), so that model is compared with
allow_cache_entry_mutation=True on the torch side (the kept set only: torch then serves the written values, and hpac
keeps its own copy of them, Note [Copy on write]), and a model without the write (norm_topk_prob false) is compared
in full.
"""
import functools
import gc
from collections import defaultdict

import pytest
import torch

import hpac
from hpac._loader import _major_minor
from hpac.harness.parity import assert_same

pytestmark = pytest.mark.skipif(
    _major_minor(torch.__version__) < (2, 4),
    reason=f"torch's SAC with CheckpointPolicy needs torch >= 2.4 (this is {torch.__version__})")

transformers = pytest.importorskip("transformers", reason="the Qwen3-MoE comparisons need transformers")

if _major_minor(torch.__version__) >= (2, 4):
    from torch.utils.checkpoint import CheckpointPolicy
    aten = torch.ops.aten

SPEC = dict(num_layers=2, hidden_size=64, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
            intermediate_size=128, moe_intermediate_size=32, num_experts=8, num_experts_per_tok=2, vocab_size=128,
            rope_theta=1e6, rms_norm_eps=1e-6)


def qwen3_moe(norm_topk_prob):
    """norm_topk_prob None: a dense Llama of the same width instead (no in-place writes anywhere in its layers)."""
    if norm_topk_prob is None:
        cfg = transformers.LlamaConfig(vocab_size=SPEC["vocab_size"], hidden_size=SPEC["hidden_size"],
                                       intermediate_size=SPEC["intermediate_size"], num_hidden_layers=SPEC["num_layers"],
                                       num_attention_heads=SPEC["num_attention_heads"],
                                       num_key_value_heads=SPEC["num_key_value_heads"], max_position_embeddings=64)
        cfg._attn_implementation = "sdpa"
        torch.manual_seed(1234)
        model = transformers.LlamaForCausalLM(cfg)
        model.train()
    else:
        import hpac.harness.models as hm
        model = hm.qwen3_moe_model(dict(SPEC, norm_topk_prob=norm_topk_prob), 1234)
    model.config.use_cache = False
    return model


def tokens():
    g = torch.Generator().manual_seed(7)
    return torch.randint(0, SPEC["vocab_size"], (2, 24), generator=g)


# ---- the rules as torch's SAC runs them ------------------------------------------------------------------------


def torchtitan_save_ops():
    """torchtitan 0.3.0 _get_default_save_ops (torchtitan/distributed/activation_checkpoint.py), resolved the same
    way: compute_intensive_ops' .default, its compute ops and comm ops where they exist."""
    from torch._functorch.partitioners import get_default_op_list
    ops = {op.default for op in get_default_op_list().compute_intensive_ops}
    ops |= {aten._scaled_dot_product_cudnn_attention.default, aten._scaled_dot_product_attention_math.default,
            aten._scaled_dot_product_fused_attention_overrideable.default, aten.max.default, aten.linear.default,
            aten.topk.default, torch.ops._c10d_functional.reduce_scatter_tensor.default,
            torch.ops._c10d_functional.all_to_all_single.default}
    return ops


def torchtitan_policy(mm_recompute_shapes=()):
    """torchtitan 0.3.0 SelectiveAC._wrap_block's wrapped_policy, line by line (one per checkpoint call)."""
    save_ops = torchtitan_save_ops()
    shapes = {torch.Size(s) for s in mm_recompute_shapes}
    mm_ops = (aten.mm.default, aten.linear.default)
    meta = {"forward_mm_count": 0, "recompute_mm_count": 0}

    def wrapped_policy(ctx, func, *args, **kwargs):
        if (func == aten._to_copy.default and "cuda" in str(args[0].device) and "device" in kwargs
                and str(kwargs["device"]) == "cpu"):
            return CheckpointPolicy.MUST_SAVE
        key = f"{'recompute' if ctx.is_recompute else 'forward'}_mm_count"
        if func in mm_ops:
            weight_shape = args[1].shape
            if func == aten.linear.default:
                weight_shape = torch.Size((weight_shape[1], weight_shape[0]))
            if weight_shape in shapes:
                return CheckpointPolicy.PREFER_RECOMPUTE
            meta[key] += 1
        if func in save_ops:
            if func in mm_ops and meta[key] % 2 == 0:
                return CheckpointPolicy.PREFER_RECOMPUTE
            return CheckpointPolicy.MUST_SAVE
        return CheckpointPolicy.PREFER_RECOMPUTE

    return wrapped_policy


def save_all_but_policy(ops):
    """Views recomputed too: hpac never saves a view (Note [Views are recomputed]); torch's SAC would cache it and
    with it keep its base alive (98 KB more on the dense model here)."""
    def policy(ctx, func, *args, **kwargs):
        recompute = func in ops or _returns_alias(func)
        return CheckpointPolicy.PREFER_RECOMPUTE if recompute else CheckpointPolicy.MUST_SAVE
    return policy


def occurrence_policy(saved):
    """saved: {OpOverload: set of occurrences counted from 0}."""
    calls = defaultdict(int)

    def policy(ctx, func, *args, **kwargs):
        n = calls[func]
        calls[func] += 1
        return CheckpointPolicy.MUST_SAVE if n in saved.get(func, ()) else CheckpointPolicy.PREFER_RECOMPUTE
    return policy


def _name(func):
    return f"{func._schema.name}.{func._overloadname}".replace(".default", "")


def _returns_alias(func):
    return any(r.alias_info is not None and not r.alias_info.is_write for r in func._schema.returns) or \
        func._schema.name in ("aten::_unsafe_view", "aten::unsafe_split", "aten::unsafe_chunk")


def recording(policy, kept):
    """policy, appending (op, occurrence) to `kept` for each save answer (views left out: hpac never saves one,
    Note [Views are recomputed], and a view keeps no bytes of its own)."""
    calls = defaultdict(int)

    def wrapped(ctx, func, *args, **kwargs):
        answer = policy(ctx, func, *args, **kwargs)
        n = calls[func]
        calls[func] += 1
        if answer in (CheckpointPolicy.MUST_SAVE, CheckpointPolicy.PREFER_SAVE) and not _returns_alias(func):
            kept.append((_name(func), n))
        return answer
    return wrapped


# ---- one training step under each implementation ---------------------------------------------------------------


def step(model, context_fn):
    """Forward and backward with every decoder layer checkpointed by torch.utils.checkpoint (context_fn); returns
    (the bytes the forward left allocated, the parameters' gradients)."""
    import hpac.hf
    if context_fn is not None:
        for layer in model.model.layers:
            hpac.hf.wrap_torch_checkpoint(layer, context_fn)
    hpac.track_memory()
    ids = tokens()
    gc.collect()  # earlier runs' models go now, not during this forward
    base = hpac.cpu_tensor_memory_stats()["current_bytes"]
    out = model(input_ids=ids, labels=ids, use_cache=False)
    after_forward = hpac.cpu_tensor_memory_stats()["current_bytes"] - base
    out.loss.backward()
    return after_forward, [p.grad for p in model.parameters()]


def run_torch(policy_factory, norm_topk_prob, allow=False):
    """torch's SAC: (kept (op, occurrence) per layer call, bytes after forward, gradients)."""
    kept = []

    def context_fn():
        kept.append([])
        return torch.utils.checkpoint.create_selective_checkpoint_contexts(
            recording(policy_factory(), kept[-1]), allow)

    model = qwen3_moe(norm_topk_prob)
    after_forward, grads = step(model, context_fn)
    return kept, after_forward, grads


def run_hpac(policy, norm_topk_prob):
    invocations = []
    model = qwen3_moe(norm_topk_prob)
    after_forward, grads = step(model, hpac.context_fn(policy, record_ops=True, on_invocation=invocations.append))
    # What hpac's routing check keeps of the routing ops it recomputes (Note [Routing is verified]): torch keeps nothing
    # for that, so it is left out of the comparison.
    after_forward -= sum(inv.stats()["routing_kept_bytes"] for inv in invocations)
    kept = []
    for inv in invocations:
        calls, saved = defaultdict(int), []
        for line in inv.op_log():
            phase, op, action = line.split()
            if phase != "forward":
                continue
            if action == "saved":
                saved.append((op, calls[op]))
            calls[op] += 1
        kept.append(saved)
    return kept, after_forward, grads


@functools.lru_cache(maxsize=None)
def off_grads(norm_topk_prob):
    return step(qwen3_moe(norm_topk_prob), None)[1]


def check_same(policy, torch_policy_factory, norm_topk_prob=False, expect=None):
    """hpac's `policy` keeps what torch's SAC keeps with the same rules, the same bytes, and gradients equal to no
    checkpointing bit for bit. Returns the kept list."""
    kept_t, bytes_t, grads_t = run_torch(torch_policy_factory, norm_topk_prob)
    kept_h, bytes_h, grads_h = run_hpac(policy, norm_topk_prob)
    assert len(kept_h) == SPEC["num_layers"]
    assert kept_h == kept_t
    assert bytes_h == bytes_t
    ref = off_grads(norm_topk_prob)
    assert_same(grads_h, list(ref))
    assert_same(grads_t, list(ref))
    if expect is not None:
        assert expect(kept_h[0]), kept_h[0]
    return kept_h


def mm_shapes():
    return hpac.torchtitan_mm_shapes(qwen3_moe(False).model.layers[0], ["mlp.gate"])


# ---- torchtitan ------------------------------------------------------------------------------------------------


def test_torchtitan_keeps_what_torchtitans_policy_keeps_through_torchs_sac():
    kept = check_same("torchtitan", torchtitan_policy,
                      expect=lambda k: ("aten::topk", 0) in k and ("aten::mm", 0) in k and ("aten::mm", 1) not in k)
    # q, k, v, o projections and the router: mm 1, 3, 5 saved, 2 and 4 recomputed (counted from 1)
    assert [o for o in kept[0] if o[0] == "aten::mm"] == [("aten::mm", 0), ("aten::mm", 2), ("aten::mm", 4)]


def test_torchtitan_force_recompute_shapes_keep_what_torchtitan_keeps():
    shapes = mm_shapes()
    assert shapes == [(SPEC["hidden_size"], SPEC["num_experts"])]  # the router's (in, out)
    kept = check_same(hpac.PolicySpec("torchtitan", shapes), functools.partial(torchtitan_policy, shapes))
    # the router's mm is recomputed and not counted: q, v saved; k, o recomputed
    assert [o for o in kept[0] if o[0] == "aten::mm"] == [("aten::mm", 0), ("aten::mm", 2)]


def test_torchtitan_on_the_router_that_renormalises_in_place():
    """norm_topk_prob: the saved top-k values are divided in place. torch's SAC needs allow_cache_entry_mutation to
    run at all (it then serves the written values); hpac keeps the same (op, occurrence) list, copies the values on
    the write (Note [Copy on write]) and gives exact gradients."""
    with pytest.raises(RuntimeError, match="mutated"):
        run_torch(torchtitan_policy, True)
    kept_t, bytes_t, _ = run_torch(torchtitan_policy, True, allow=True)
    kept_h, bytes_h, grads_h = run_hpac("torchtitan", True)
    assert kept_h == kept_t
    assert bytes_h == bytes_t  # the copy replaces the written original, which nothing else holds
    assert_same(grads_h, list(off_grads(True)))


# ---- save_all_but and save_occurrences -------------------------------------------------------------------------


def test_save_all_but_keeps_what_the_complement_keeps():
    """On the dense model: saving (nearly) everything of the MoE block's layer through torch's SAC fails on its own
    (the expert permutation's inverse is written in place into an empty_like torch saved: "... has been mutated";
    allowed, torch serves the written buffer and backward indexes out of bounds)."""
    listed = [aten.mul.Tensor, aten.silu.default, aten._softmax.default]
    check_same(hpac.PolicySpec("save_all_but", listed), lambda: save_all_but_policy(set(listed)), norm_topk_prob=None,
               expect=lambda k: ("aten::mm", 1) in k and not any(o[0] == "aten::mul.Tensor" for o in k))


def test_save_occurrences_keeps_the_listed_occurrences():
    patterns = ["aten::mm@0,2:4", "aten::topk@0", "aten::_grouped_mm.default@1::2"]
    saved = {aten.mm.default: {0, 2, 3}, aten.topk.default: {0}, aten._grouped_mm.default: set(range(1, 64, 2))}
    check_same(hpac.PolicySpec("save_occurrences", patterns), lambda: occurrence_policy(saved),
               expect=lambda k: [o for o in k if o[0] == "aten::mm"] == [("aten::mm", 0), ("aten::mm", 2),
                                                                          ("aten::mm", 3)])


# ---- names, parameters and errors ------------------------------------------------------------------------------


def test_kinds_are_named_and_their_parameters_checked_in_cpp():
    hpac.context_fn("torchtitan")
    hpac.context_fn(hpac.PolicySpec("torchtitan", [(64, 8), "32x4"]))
    assert hpac.PolicySpec("torchtitan", [(64, 8)]).params == ("64x8",)
    assert hpac.PolicySpec("save_all_but", [aten.mm.default, aten.bmm]).params == ("aten::mm.default", "aten::bmm")
    with pytest.raises(RuntimeError, match="unknown policy kind 'titan'; allowed: .*torchtitan, save_all_but, "
                                           "save_occurrences"):
        hpac.context_fn("titan")
    with pytest.raises(RuntimeError, match="shape '64' is not allowed; allowed: 'INxOUT'"):
        hpac.context_fn(hpac.PolicySpec("torchtitan", ["64"]))
    with pytest.raises(RuntimeError, match="'x' is not allowed; allowed: 'ns::op\\[.overload\\]@ITEMS'"):
        hpac.Invocation(hpac.PolicySpec("save_occurrences", ["aten::mm@1,x"]))
    with pytest.raises(RuntimeError, match="policy kind 'selective' takes no parameters"):
        hpac.Invocation(hpac.PolicySpec("selective", ["aten::mm"]))
    with pytest.raises(RuntimeError, match="save_all_but entry: 'aten::nope' names no operator"):
        hpac.Invocation(hpac.PolicySpec("save_all_but", ["aten::nope"]))
    with pytest.raises(TypeError, match="params must be a list"):
        hpac.PolicySpec("save_all_but", "aten::mm")


def test_torchtitan_mm_shapes_reads_linears_by_name():
    class Block(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.moe = torch.nn.Module()
            self.moe.router = torch.nn.Module()
            self.moe.router.gate = torch.nn.Linear(32, 4, bias=False)
            self.moe.norm = torch.nn.LayerNorm(32)
            self.proj = torch.nn.Linear(32, 32)

    assert hpac.torchtitan_mm_shapes(Block()) == [(32, 4)]
    assert hpac.torchtitan_mm_shapes(Block(), []) == []
    with pytest.raises(ValueError, match="expected to match a nn.Linear"):
        hpac.torchtitan_mm_shapes(Block(), ["moe.norm"])


def test_a_spec_is_a_constant_for_torch_compile():
    """Equal specs give equal context_fn partials (one compiled graph per spec, Note [context_fn under
    torch.compile]) and the partial rebuilds the spec."""
    a = hpac.context_fn(hpac.PolicySpec("torchtitan", [(64, 8)]))
    b = hpac.context_fn(hpac.PolicySpec("torchtitan", [(64, 8)]))
    assert a.args == b.args
    assert hpac._regions._policy_of(a.args[0]) == hpac.PolicySpec("torchtitan", ["64x8"])
