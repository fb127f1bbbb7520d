"""hpac through torch.utils.checkpoint's context_fn (torch >= 2.1): parity with no checkpointing with torch's early
stop of the recompute on and off, a recompute entered twice (retain_graph, double backward): exact under full, a
clear error under selective (its saved outputs are released as they are served, as in PyTorch's own SAC), and the
contexts re-enterable."""
import pytest
import torch

import hpac
from hpac._loader import _major_minor
from hpac.harness.blocks import Block
from hpac.harness.parity import assert_same

pytestmark = pytest.mark.skipif(
    _major_minor(torch.__version__) < (2, 1),
    reason=f"torch.utils.checkpoint has no context_fn before torch 2.1 (this is torch {torch.__version__})")

if _major_minor(torch.__version__) >= (2, 1):
    from torch.utils.checkpoint import checkpoint as torch_checkpoint, set_checkpoint_early_stop


def small_problem():
    torch.manual_seed(0)
    w1 = torch.randn(8, 8, requires_grad=True)
    w2 = torch.randn(8, 8, requires_grad=True)
    x = torch.randn(4, 8, requires_grad=True)
    return (lambda t: torch.tanh(torch.tanh(t @ w1) @ w2).sum(-1)), x, [w1, w2]


def checkpointed(fn, x, policy):
    if policy is None:
        return fn(x)
    return torch_checkpoint(fn, x, use_reentrant=False, context_fn=hpac.context_fn(policy))


@pytest.mark.parametrize("early_stop", [True, False], ids=["early_stop", "no_early_stop"])
@pytest.mark.parametrize("policy", ["full", "selective"])
def test_parity_on_the_moe_block_with_and_without_early_stop(policy, early_stop):
    torch.manual_seed(0)
    model = torch.nn.Sequential(Block(), Block())
    torch.manual_seed(5)
    x0 = torch.randn(2, 16, 32)

    def step(p):
        model.zero_grad(set_to_none=True)
        x = x0.clone().requires_grad_(True)
        torch.manual_seed(3)  # dropout
        h = x
        with set_checkpoint_early_stop(early_stop):
            for block in model:
                h = checkpointed(block, h, p)
            h.pow(2).mean().backward()
        return [x.grad] + [q.grad for q in model.parameters()]

    ref = step(None)
    hpac.reset_global_stats()
    got = step(policy)
    stats = hpac.global_stats()
    assert_same(got, ref)
    assert stats["recomputes"] == 2 and stats["ops_recompute"] > 0
    if early_stop:
        # torch stops the recompute once the last tensor backward needs is back: never more ops than the forward.
        assert stats["ops_recompute"] <= stats["ops_forward"]
    else:
        assert stats["ops_recompute"] == stats["ops_forward"]
    if policy == "selective":
        assert stats["served"] > 0
    else:
        assert stats["saved"] == 0


def test_retain_graph_full_recomputes_again_exactly():
    fn, x, params = small_problem()
    ref = torch.autograd.grad(fn(x).sum(), [x] + params)
    y = checkpointed(fn, x, "full").sum()
    hpac.reset_global_stats()
    first = torch.autograd.grad(y, [x] + params, retain_graph=True)
    second = torch.autograd.grad(y, [x] + params)  # the same recompute context entered again
    assert hpac.global_stats()["recomputes"] == 2
    assert_same(first, ref)
    assert_same(second, ref)


def test_retain_graph_selective_is_a_clear_error():
    fn, x, params = small_problem()
    y = checkpointed(fn, x, "selective").sum()
    y.backward(retain_graph=True)
    with pytest.raises(RuntimeError, match=r"aten::mm .* was already served: backward ran through this selective "
                                           r"checkpoint region an extra time"):
        y.backward()


def test_double_backward_full_equals_no_checkpointing():
    fn, x, params = small_problem()

    def second_order(policy):
        g, = torch.autograd.grad(checkpointed(fn, x, policy).sum(), x, create_graph=True)
        return [g.detach()] + list(torch.autograd.grad(g.pow(2).sum(), params))

    assert_same(second_order("full"), second_order(None))


def test_double_backward_selective_is_a_clear_error():
    fn, x, params = small_problem()
    g, = torch.autograd.grad(checkpointed(fn, x, "selective").sum(), x, create_graph=True)
    with pytest.raises(RuntimeError, match="an extra time"):
        torch.autograd.grad(g.pow(2).sum(), params)


def test_checkpoint_wrapper_and_hpac_checkpoint_agree_with_context_fn():
    torch.manual_seed(0)
    block = Block(dropout=0.0)
    x0 = torch.randn(2, 8, 32)

    def grads(call):
        block.zero_grad(set_to_none=True)
        x = x0.clone().requires_grad_(True)
        call(x).pow(2).mean().backward()
        return [x.grad] + [p.grad for p in block.parameters()]

    ref = grads(block)
    via_context_fn = grads(lambda x: checkpointed(block, x, "selective"))
    via_checkpoint = grads(lambda x: hpac.checkpoint(block, x, policy="selective"))
    hpac.checkpoint_wrapper(block, policy="selective")
    try:
        via_wrapper = grads(block)
    finally:
        hpac.unwrap_checkpoint(block)
    for got in (via_context_fn, via_checkpoint, via_wrapper):
        assert_same(got, ref)


@pytest.mark.parametrize("early_stop", [True, False], ids=["early_stop", "no_early_stop"])
def test_an_output_the_recompute_never_needs_is_released(early_stop):
    """Note [Decisions are recorded]: neg's output is saved in forward, but backward needs nothing from it (neg saves
    no tensor). torch's early stop ends the recompute (by an exception) before neg runs: the entry is released
    silently. Without early stop the recompute reaches neg and is served it."""
    import warnings
    torch.manual_seed(1)
    w = torch.randn(8, 8, requires_grad=True)
    x = torch.randn(4, 8, requires_grad=True)
    fn = lambda t: torch.neg(t @ w)  # noqa: E731
    ref = torch.autograd.grad(fn(x).sum(), [x, w])
    hpac.reset_global_stats()
    with set_checkpoint_early_stop(early_stop), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        y = torch_checkpoint(fn, x, use_reentrant=False, context_fn=hpac.context_fn(["aten::neg"]))
        got = torch.autograd.grad(y.sum(), [x, w])
    assert_same(got, ref)
    stats = hpac.global_stats()
    assert stats["saved"] == 1
    assert (stats["unserved"], stats["served"]) == ((1, 0) if early_stop else (0, 1))
    assert not [w for w in caught if "hpac" in str(w.message)]


def test_context_fn_keeps_an_inline_budget_alive():
    """context_fn(hpac.budget(...)) written inline: the partial names its Budget by number (a constant, for
    torch.compile) and still keeps the region alive, so later calls replay its plan."""
    import gc
    fn, x, params = small_problem()
    cf = hpac.context_fn(hpac.budget(0.5))
    gc.collect()
    for _ in range(2):
        torch_checkpoint(fn, x, use_reentrant=False, context_fn=cf).sum().backward()
    assert cf.budget.stage == "planned"
