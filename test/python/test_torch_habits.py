"""A torch user's habits on hpac's public API (issue 49): torch.utils.checkpoint's keywords on hpac.checkpoint (Note
[torch's keywords on hpac.checkpoint], _frame.py), every policy through checkpoint_wrapper(policy=...) with mode= a
deprecated alias, the CPU tensor meters under names that say so, and what left the public surface.

Gradients are compared bit for bit with the same model run without a checkpoint; that the checkpoint ran, and under
which policy, shows in hpac's counters (hpac.global_stats: recomputes, saved, served).
"""
import warnings

import pytest
import torch

import hpac
from hpac._loader import _major_minor
from hpac.harness.parity import assert_same

HAS_MODES = _major_minor(torch.__version__) >= (2, 1)  # a policy function needs torch's dispatch-mode stack
HAS_COMPILE = _major_minor(torch.__version__) >= (2, 4)  # hpac's compiled path (test_compile.py)


def _model(seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU(), torch.nn.Linear(8, 8), torch.nn.ReLU(),
                               torch.nn.Linear(8, 8))


def _input() -> torch.Tensor:
    torch.manual_seed(1)
    return torch.randn(4, 8, requires_grad=True)


def _grads(call, model, x):
    """Gradients of call(x).sum() for x and model's parameters, with hpac's counters of that step."""
    hpac.reset_global_stats()
    grads = torch.autograd.grad(call(x).sum(), [x, *model.parameters()])
    return list(grads), hpac.global_stats()


# ---------------------------------------------------------------------------------------------------------------
# hpac.checkpoint takes torch.utils.checkpoint's keywords; none reaches fn

@pytest.mark.parametrize("use_reentrant", [False, None])
def test_use_reentrant_false_checkpoints_with_exact_gradients(use_reentrant):
    model, x = _model(), _input()
    ref, _ = _grads(model, model, x)
    got, stats = _grads(lambda t: hpac.checkpoint(model, t, use_reentrant=use_reentrant, policy="selective"), model, x)
    assert_same(got, ref)
    assert stats["recomputes"] == 1 and stats["served"] > 0  # checkpointed, not a plain call


def test_torch_keywords_at_their_defaults_are_accepted():
    model, x = _model(), _input()
    ref, _ = _grads(model, model, x)
    noop = getattr(torch.utils.checkpoint, "noop_context_fn", None)  # torch >= 2.0
    torch_kwargs = dict(use_reentrant=False, preserve_rng_state=True, determinism_check="default", debug=False,
                        early_stop=True, context_fn=noop)
    got, stats = _grads(lambda t: hpac.checkpoint(model, t, policy="full", **torch_kwargs), model, x)
    assert_same(got, ref)
    assert stats["recomputes"] == 1


def test_use_reentrant_true_is_refused_as_hpac_is_non_reentrant():
    model, x = _model(), _input()
    with pytest.raises(ValueError, match=r"use_reentrant=True is not allowed; allowed: False, None\. hpac's "
                                         r"checkpoint is non-reentrant.*Pass use_reentrant=False.*"
                                         r"torch\.utils\.checkpoint\.checkpoint\(fn, \.\.\., use_reentrant=True\) "
                                         r"without hpac"):
        hpac.checkpoint(model, x, use_reentrant=True)


@pytest.mark.parametrize("make", [lambda: (lambda: (None, None)), lambda: hpac.context_fn("selective")],
                         ids=["any", "hpac.context_fn"])
def test_context_fn_is_refused_with_policy_named(make):
    model, x = _model(), _input()
    with pytest.raises(ValueError, match=r"context_fn is not allowed: hpac makes the region's contexts from "
                                         r"policy=\..*hpac\.checkpoint\(fn, \.\.\., policy=\.\.\.\).*"
                                         r"context_fn=hpac\.context_fn\(policy\)"):
        hpac.checkpoint(model, x, context_fn=make())


def test_debug_true_is_refused_with_what_shows_each_op():
    """torch refuses debug=True beside any context_fn but its own; hpac's region is one (Note [torch's keywords on
    hpac.checkpoint]). debug=False is torch's default and accepted (test_torch_keywords_at_their_defaults...)."""
    model, x = _model(), _input()
    with pytest.raises(ValueError, match=r"debug=True is not allowed; allowed: False\..*hpac\.explain"):
        hpac.checkpoint(model, x, debug=True)


def test_a_wrapped_modules_own_keywords_reach_it_whatever_their_names():
    """checkpoint_wrapper hands the module's keywords to its forward as they are, even those named like torch's or
    hpac's own keywords (debug, use_reentrant, policy)."""
    class Scaled(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.inner = _model()

        def forward(self, x, debug=False, use_reentrant=None, policy=1.0):
            return self.inner(x) * (2.0 if debug else 1.0) * policy * (3.0 if use_reentrant else 1.0)

    plain, wrapped, x = Scaled(), Scaled(), _input()
    hpac.checkpoint_wrapper(wrapped, policy="full")
    ref, _ = _grads(lambda t: plain(t, debug=True, use_reentrant=True, policy=0.5), plain, x)
    got, stats = _grads(lambda t: wrapped(t, debug=True, use_reentrant=True, policy=0.5), wrapped, x)
    assert_same(got, ref)
    assert stats["recomputes"] == 1


@pytest.mark.skipif(not HAS_COMPILE, reason=f"hpac's compiled path needs torch >= 2.4 (this is {torch.__version__})")
def test_torch_keywords_stay_out_of_fn_under_compile():
    """While Dynamo traces hpac.checkpoint it calls torch's checkpoint with hpac's context_fn: torch's keywords
    given to hpac.checkpoint must not reach fn, nor be given to torch's twice."""
    model, x = _model(), _input()
    ref, _ = _grads(model, model, x)
    torch._dynamo.reset()
    compiled = torch.compile(lambda t: hpac.checkpoint(model, t, policy="selective", use_reentrant=False,
                                                       preserve_rng_state=True, debug=False),
                             backend="aot_eager", fullgraph=True)
    got, _ = _grads(compiled, model, x)
    assert_same(got, ref)
    # Refused under compile as in eager (Dynamo, meeting the error, runs the frame eagerly): given on to torch's
    # checkpoint, use_reentrant=True beside hpac's context_fn ran without a word.
    torch._dynamo.reset()
    compiled = torch.compile(lambda t: hpac.checkpoint(model, t, use_reentrant=True), backend="aot_eager")
    with pytest.raises(ValueError, match="use_reentrant=True is not allowed"):
        compiled(x)


# ---------------------------------------------------------------------------------------------------------------
# checkpoint_wrapper(module, policy=...) takes every policy hpac.checkpoint takes

def _save_addmm(ctx, op, *args, **kwargs):
    return op == torch.ops.aten.addmm.default


POLICIES = {
    "full": lambda: "full",
    "selective": lambda: "selective",
    "save_all": lambda: "save_all",
    "PolicySpec": lambda: hpac.PolicySpec("save_all_but", [torch.ops.aten.relu.default]),
    "save_list": lambda: [torch.ops.aten.addmm.default],
    "policy_fn": lambda: _save_addmm,
    "Budget": lambda: hpac.budget(0.5),
}


@pytest.mark.parametrize("name", sorted(POLICIES))
def test_checkpoint_wrapper_takes_every_policy(name):
    """Exact gradients against the unwrapped model, and the same counters as hpac.checkpoint with the same policy:
    the wrapper runs that policy (a budget: its profile, then its plan)."""
    if name == "policy_fn" and not HAS_MODES:
        pytest.skip(f"a policy function needs torch >= 2.1 (this is {torch.__version__})")
    plain, wrapped, direct, x = _model(), _model(), _model(), _input()
    hpac.checkpoint_wrapper(wrapped, policy=POLICIES[name]())
    direct_policy = POLICIES[name]()
    for _ in range(2):
        ref, _ = _grads(plain, plain, x)
        got, stats = _grads(wrapped, wrapped, x)
        _, direct_stats = _grads(lambda t: hpac.checkpoint(direct, t, policy=direct_policy), direct, x)
        assert_same(got, ref)
        assert stats == direct_stats
    # save_all keeps every output, so hpac's frame holds them all and backward never re-runs the module.
    assert stats["ops_forward"] > 0 and stats["recomputes"] == (0 if name == "save_all" else 1)
    assert (stats["saved"] > 0) == (name != "full")


def test_checkpoint_wrapper_defaults_to_full_and_takes_the_policy_positionally():
    default, positional, x = _model(), _model(), _input()
    hpac.checkpoint_wrapper(default)
    hpac.checkpoint_wrapper(positional, "selective")
    _, stats = _grads(default, default, x)
    assert stats["recomputes"] == 1 and stats["saved"] == 0
    _, stats = _grads(positional, positional, x)
    assert stats["served"] > 0


def test_checkpoint_wrapper_checks_the_policy_when_it_wraps():
    with pytest.raises(RuntimeError, match="unknown policy kind 'sometimes'; allowed: full, selective"):
        hpac.checkpoint_wrapper(_model(), policy="sometimes")
    with pytest.raises(RuntimeError, match="routing: 'bad' is not allowed; allowed: verify, save"):
        hpac.checkpoint_wrapper(_model(), policy="full", routing="bad")


class _CountsCalls(torch.nn.Module):
    """Writes a buffer in place on every call: the recompute writes it again unless state_writes says otherwise."""

    def __init__(self):
        super().__init__()
        self.inner = _model()
        self.register_buffer("calls", torch.zeros(()))

    def forward(self, x):
        self.calls.add_(1)
        return self.inner(x)


def test_checkpoint_wrapper_carries_its_region_options_to_every_call():
    x = _input()
    skipping = hpac.checkpoint_wrapper(_CountsCalls(), policy="full", state_writes="skip")
    for _ in range(2):
        skipping(x).sum().backward()
    assert skipping.calls.item() == 2  # once per step: the recompute's write was skipped
    strict = hpac.checkpoint_wrapper(_CountsCalls(), policy="full", state_writes="error")
    out = strict(x).sum()
    with pytest.raises(RuntimeError, match=r"writes 'calls' \(\[\] Float\) in place, a tensor from outside"):
        out.backward()


def test_mode_is_a_deprecated_alias_of_policy():
    model, x = _model(), _input()
    with pytest.warns(DeprecationWarning, match=r"checkpoint_wrapper\(module, mode=\.\.\.\) is deprecated; pass "
                                                r"policy="):
        hpac.checkpoint_wrapper(model, mode="selective")
    _, stats = _grads(model, model, x)
    assert stats["served"] > 0  # the alias's policy is the one applied
    with pytest.raises(TypeError, match="both policy= and mode="):
        hpac.checkpoint_wrapper(model, policy="full", mode="full")


def test_checkpoint_wrapper_policy_gives_no_warning():
    with warnings.catch_warnings():
        warnings.simplefilter("error", DeprecationWarning)
        hpac.checkpoint_wrapper(_model(), policy="selective")


# ---------------------------------------------------------------------------------------------------------------
# The CPU tensor meters, and the public surface

@pytest.mark.parametrize("old, new", [("memory_stats", "cpu_tensor_memory_stats"),
                                      ("reset_peak_memory", "reset_cpu_tensor_peak")])
def test_old_meter_names_warn_and_do_the_same(old, new):
    with warnings.catch_warnings():
        warnings.simplefilter("error", DeprecationWarning)
        value = getattr(hpac, new)()
    with pytest.warns(DeprecationWarning, match=rf"hpac\.{old} is deprecated: it counts CPU tensor bytes only, and "
                                                rf"is now named hpac\.{new}"):
        old_value = getattr(hpac, old)()
    assert type(old_value) is type(value)
    if isinstance(value, dict):
        assert sorted(old_value) == sorted(value) == ["allocations", "current_bytes", "peak_bytes"]
    assert new in hpac.__all__ and old not in hpac.__all__


def test_benchmark_hooks_and_private_helpers_are_not_public():
    for name in ("checkpoint_with", "_major_minor", "_ops_present"):
        assert not hasattr(hpac, name), name
        assert name not in hpac.__all__
    from hpac.harness import checkpoint_with
    inv = hpac.Invocation("full")
    model, x = _model(), _input()
    ref, _ = _grads(model, model, x)
    got, stats = _grads(lambda t: checkpoint_with(inv, model, t), model, x)
    assert_same(got, ref)
    assert stats["recomputes"] == 1
