"""Failures users of selective activation checkpointing reported elsewhere, on models written here (the transformers
MoE models: test/python/hf/test_hf_reported_failures.py; docs/reliability.md, "Failures reported elsewhere"):

- a stateful gate (NeMo-Automodel PR #3247): the forward adds each step's expert counts to a buffer, and the recompute
  added them again (Note [State written twice], replay/state_writes.h); BatchNorm's running statistics likewise;
- outputs cached by SAC bypass the saved_tensors_hooks around the region, save_on_cpu among them (pytorch #158657,
  #170284, PR #190581; Note [Outer saved-tensor hooks], replay/outer_hooks.h);
- router drift (torchtitan #1117, NeMo-Automodel #3325): the recompute's topk chose other experts (Note [Routing is
  verified], replay/routing_check.h). CPU kernels are deterministic, so the drift is injected (test/python/drift.py):
  a dispatch mode active only during backward hands every topk other scores, the region's op sequence unchanged.

Each path is the one a user takes: hpac.checkpoint, and torch.utils.checkpoint with hpac.context_fn; parity is
against a real run without checkpointing.
"""
import warnings

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import hpac
from hpac._loader import _major_minor
from drift import DriftingRouter, topk_shapes
from hpac.harness.parity import assert_same

HIDDEN, EXPERTS, TOP_K, TOKENS = 16, 4, 2, 24


class CountingGate(nn.Module):
    """A router that keeps a running count of the tokens each expert received (load-balancing statistics)."""

    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(HIDDEN, EXPERTS, bias=False)
        self.register_buffer("expert_load", torch.zeros(EXPERTS))

    def forward(self, x):
        weights, experts = self.proj(x).softmax(-1).topk(TOP_K, dim=-1)
        self.expert_load += F.one_hot(experts, EXPERTS).sum((0, 1)).to(self.expert_load.dtype)
        return weights / weights.sum(-1, keepdim=True), experts


class MoeBlock(nn.Module):
    def __init__(self, batch_norm=False):
        super().__init__()
        self.gate = CountingGate()
        self.experts = nn.ModuleList(nn.Linear(HIDDEN, HIDDEN) for _ in range(EXPERTS))
        self.norm = nn.BatchNorm1d(HIDDEN) if batch_norm else nn.Identity()

    def forward(self, x):
        x = self.norm(x)
        weights, experts = self.gate(x)
        out = torch.zeros_like(x)
        for e in range(EXPERTS):
            token, slot = torch.where(experts == e)
            out.index_add_(0, token, self.experts[e](x[token]).tanh() * weights[token, slot, None])
        return out + x


def _block(batch_norm=False):
    torch.manual_seed(0)
    return MoeBlock(batch_norm)


def _inputs(step=0):
    g = torch.Generator().manual_seed(100 + step)
    return torch.randn(TOKENS, HIDDEN, generator=g, requires_grad=True)


def _policy(name):
    return hpac.budget(0.5) if name == "budget" else name


def _run(block, checkpointed, steps=2):
    """Trains `steps` forward/backward passes; returns the input and parameter gradients of each step."""
    grads = []
    for step in range(steps):
        x = _inputs(step)
        block.zero_grad(set_to_none=True)
        checkpointed(block, x).square().sum().backward()
        grads.append([x.grad] + [p.grad.clone() for p in block.parameters()])
    return grads


def _hpac_checkpoint(policy, **rules):
    return lambda block, x: hpac.checkpoint(block, x, policy=policy, **rules)


_HAS_CONTEXT_FN = _major_minor(torch.__version__) >= (2, 1)


def _context_fn(policy, invocations, **rules):
    if not _HAS_CONTEXT_FN:
        pytest.skip(f"torch.utils.checkpoint has no context_fn before torch 2.1 (this is torch {torch.__version__})")

    def call(block, x):
        hook = lambda inv: (invocations.append(inv), inv.name_state(block))
        return torch.utils.checkpoint.checkpoint(
            block, x, use_reentrant=False, context_fn=hpac.context_fn(policy, on_invocation=hook, **rules))
    return call


def _plain(block, x):
    return block(x)


# --- state written twice ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("policy", ["full", "selective", "budget"])
def test_stateful_gate_is_counted_once_with_state_writes_skip(policy):
    off = _block()
    ref = _run(off, _plain)
    invocations = []
    block = _block()
    got = _run(block, _context_fn(_policy(policy), invocations, state_writes="skip"))
    for g, r in zip(got, ref):
        assert_same(g, r, atol=0.0)
    assert torch.equal(block.gate.expert_load, off.gate.expert_load)
    assert off.gate.expert_load.sum().item() == 2 * TOKENS * TOP_K  # two steps counted once each
    # Every step's write was met in its recompute and not made again (a budget plan never saves it: serving its
    # snapshot would overwrite what other regions wrote to the tensor since).
    skipped = [inv.stats()["state_writes_skipped"] for inv in invocations]
    assert skipped == [1, 1], [inv.stats() for inv in invocations]


@pytest.mark.parametrize("policy", ["full", "selective"])
def test_stateful_gate_counted_twice_by_default_is_named_in_one_warning(policy):
    off = _block()
    _run(off, _plain)
    block = _block()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        _run(block, _hpac_checkpoint(policy))
    # What torch.utils.checkpoint does as well: the recompute writes the buffer again.
    assert torch.equal(block.gate.expert_load, 2 * off.gate.expert_load)
    named = [w for w in caught if "gate.expert_load" in str(w.message)]
    assert len(named) <= 1 and (named or policy == "selective"), [str(w.message) for w in caught]
    text = str(named[0].message) if named else ""
    if named:
        assert "aten::add_.Tensor occurrence 0" in text and "state_writes: skip" in text, text


def test_state_write_warnings_are_once_per_op_and_name_and_follow_set_warn_always():
    """The warned-about keys are op and state name, never sizes: a run over many shapes warns once and keeps one key
    (Note [Nothing outlives its model]); under torch.set_warn_always(True) every recompute warns, as TORCH_WARN_ONCE."""
    block = _block()

    def warnings_of(steps, tokens):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            for step in range(steps):
                x = torch.randn(tokens + step, HIDDEN, requires_grad=True)
                hpac.checkpoint(block, x, policy="full").sum().backward()
        return [w for w in caught if "gate.expert_load" in str(w.message)]
    previous = torch.is_warn_always_enabled()
    try:
        torch.set_warn_always(True)
        assert len(warnings_of(3, TOKENS)) == 3  # every time
        torch.set_warn_always(False)
        warnings_of(1, TOKENS)  # warned now, or by an earlier test: the key is taken either way
        assert warnings_of(3, 2 * TOKENS) == []  # other shapes, the same op and buffer: no new warning
    finally:
        torch.set_warn_always(previous)


def test_stateful_gate_with_state_writes_error_names_op_and_buffer():
    block = _block()
    x = _inputs()
    out = hpac.checkpoint(block, x, policy="selective", state_writes="error")
    with pytest.raises(RuntimeError, match=r"aten::add_\.Tensor occurrence 0 of invocation \d+ writes "
                                           r"'gate\.expert_load' \(\[4\] Float\) in place, a tensor from outside"):
        out.sum().backward()


def test_batch_norm_statistics_move_once_with_state_writes_skip():
    off = _block(batch_norm=True)
    ref = _run(off, _plain)
    block = _block(batch_norm=True)
    got = _run(block, _hpac_checkpoint("selective", state_writes="skip"))
    for g, r in zip(got, ref):
        assert_same(g, r, atol=0.0)
    for name, t in off.norm.named_buffers():
        assert torch.equal(dict(block.norm.named_buffers())[name], t), name
    assert block.norm.num_batches_tracked.item() == 2


def test_bad_state_writes_and_routing_values_are_refused():
    with pytest.raises(RuntimeError, match=r"hpac: state_writes: 'twice' is not allowed; allowed: warn, error, skip"):
        hpac.context_fn("selective", state_writes="twice")
    with pytest.raises(RuntimeError, match=r"hpac: routing: 'recompute' is not allowed; allowed: verify, save"):
        hpac.checkpoint(_block(), _inputs(), routing="recompute")


# --- outer saved-tensor hooks ----------------------------------------------------------------------------------

class CountingHooks(torch.autograd.graph.saved_tensors_hooks):
    def __init__(self):
        self.packed = self.unpacked = 0
        super().__init__(self._pack, self._unpack)

    def _pack(self, t):
        self.packed += 1
        return t

    def _unpack(self, t):
        self.unpacked += 1
        return t


@pytest.mark.parametrize("path", ["context_fn", "hpac.checkpoint"])
def test_what_a_selective_region_keeps_goes_through_the_hooks_around_it(path):
    counts = {}
    for respect in (True, False):
        invocations = []
        block = _block()
        call = (_context_fn("selective", invocations, respect_saved_tensors_hooks=respect) if path == "context_fn"
                else _hpac_checkpoint("selective", respect_saved_tensors_hooks=respect))
        hooks = CountingHooks()
        with hooks:
            _run(block, call, steps=1)
        counts[respect] = (hooks.packed, hooks.unpacked, invocations)
    (packed, unpacked, invs), (packed_off, unpacked_off, invs_off) = counts[True], counts[False]
    if path == "context_fn":
        kept = sum(inv.stats()["packed"] for inv in invs)
        assert kept > 0 and sum(inv.stats()["packed"] for inv in invs_off) == 0
        assert packed - packed_off == kept and unpacked - unpacked_off == kept, (packed, packed_off, kept)
    else:
        # hpac.checkpoint's own frame: its input goes through the hooks too, as torch.utils.checkpoint's does.
        assert packed > packed_off + 1 and unpacked > unpacked_off + 1, (packed, packed_off)


@pytest.mark.parametrize("path", ["context_fn", "hpac.checkpoint"])
@pytest.mark.parametrize("policy", ["selective", "budget"])
def test_save_on_cpu_around_a_region_trains_exactly(path, policy):
    ref = _run(_block(), _plain)
    invocations = []
    call = (_context_fn(_policy(policy), invocations) if path == "context_fn"
            else _hpac_checkpoint(_policy(policy)))
    block = _block()
    with torch.autograd.graph.save_on_cpu():
        got = _run(block, call)
    for g, r in zip(got, ref):
        assert_same(g, r, atol=0.0)
    if path == "context_fn":
        assert sum(inv.stats()["packed"] for inv in invocations) > 0


# --- router drift ----------------------------------------------------------------------------------------------

def _backward_drifting(out, block, topk_runs=True):
    """Backward under DriftingRouter. topk_runs: whether the recompute runs topk's kernel (then the router drifts);
    a served topk never reaches an outer dispatch mode (Note [Outer dispatch modes see what ran], _policy_fn.py),
    as no kernel of it runs to drift."""
    with DriftingRouter(topk_shapes(lambda: block(_inputs()))) as drift:
        out.square().sum().backward()
    assert (drift.moved > 0) == topk_runs
    return drift


@pytest.mark.parametrize("policy", ["full", "selective", "budget"])
def test_router_drift_stops_backward_naming_topk(policy):
    block = _block()
    out = hpac.checkpoint(block, _inputs(), policy=_policy(policy))
    with pytest.raises(RuntimeError, match=r"aten::topk \(default overload\) occurrence 0 of invocation \d+ routed "
                                           r"differently in the recompute than in the forward: return 1 \(\[24, 2\] "
                                           r"Long\) differs in \d+ of 48 elements"):
        _backward_drifting(out, block)


@pytest.mark.parametrize("policy", ["full", "selective", "budget"])
def test_router_drift_with_routing_save_trains_exactly(policy):
    off = _block()
    x0 = _inputs()
    off(x0).square().sum().backward()
    block = _block()
    x = _inputs()
    invocations = []
    out = _context_fn(_policy(policy), invocations, routing="save")(block, x)
    _backward_drifting(out, block, topk_runs=False)
    assert_same([x.grad] + [p.grad for p in block.parameters()], [x0.grad] + [p.grad for p in off.parameters()],
                atol=0.0)
    assert invocations[0].stats()["routing_checked"] == 0


def test_routing_is_checked_when_nothing_drifts():
    off = _block()
    ref = _run(off, _plain)
    invocations = []
    got = _run(_block(), _context_fn("selective", invocations))
    for g, r in zip(got, ref):
        assert_same(g, r, atol=0.0)
    assert all(inv.stats()["routing_checked"] >= 1 for inv in invocations), [inv.stats() for inv in invocations]
