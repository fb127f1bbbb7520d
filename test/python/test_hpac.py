"""hpac from Python, on whichever torch runs the tests (Debian's 1.13 and pip's 2.13 in tools/test.sh): parity with
no checkpointing, recompute evidence, errors as RuntimeError, the context_fn path (torch >= 2.1), LD_PRELOAD, double
loading, and a libhpac built for the other torch refused."""
import os
import shutil
import subprocess
import sys

import pytest
import torch

import hpac
from hpac._loader import _major_minor
from hpac.harness import checkpoint_with
from hpac.harness.blocks import Block
from hpac.harness.parity import assert_same

LIB = os.environ.get("HPAC_LIBRARY") or hpac.load()
PY = sys.executable  # subprocesses run the same torch as the tests
PLUGIN_PY = os.path.dirname(os.path.dirname(os.path.abspath(hpac.__file__)))


def make_model(layers=2, seed=0):
    torch.manual_seed(seed)
    return torch.nn.Sequential(*[Block() for _ in range(layers)])


def run_step(model, x0, policy=None, use_grad=False, seed=123):
    """One step; policy None = no checkpointing. Returns loss, input grad, parameter grads."""
    for p in model.parameters():
        p.grad = None
    x = x0.clone().requires_grad_(True)
    torch.manual_seed(seed)
    h = x
    for block in model:
        h = block(h) if policy is None else hpac.checkpoint(block, h, policy=policy)
    loss = h.pow(2).mean()
    params = list(model.parameters())
    if use_grad:
        grads = torch.autograd.grad(loss, [x] + params)
        return loss.detach(), grads[0], list(grads[1:])
    loss.backward()
    return loss.detach(), x.grad, [p.grad for p in params]


@pytest.fixture
def model_and_input():
    model = make_model()
    torch.manual_seed(5)
    return model, torch.randn(2, 16, 32)


@pytest.mark.parametrize("policy", ["full", "selective"])
@pytest.mark.parametrize("use_grad", [False, True], ids=["backward", "autograd_grad"])
def test_parity_with_no_checkpointing(model_and_input, policy, use_grad):
    model, x = model_and_input
    ref_loss, ref_dx, ref_dp = run_step(model, x, None, use_grad)
    hpac.reset_global_stats()
    loss, dx, dp = run_step(model, x, policy, use_grad)
    stats = hpac.global_stats()
    # Same ops in the same order on the same values: bitwise equal in fp32 on CPU.
    assert_same([loss, dx, *dp], [ref_loss, ref_dx, *ref_dp])
    assert stats["recomputes"] == 2  # one recompute per block
    # Note [The recompute stops early]: each block's recompute ends at the last tensor autograd saved that the frame
    # does not hold; a kept output after it is released unserved.
    assert 0 < stats["ops_recompute"] <= stats["ops_forward"]
    if policy == "selective":
        assert stats["saved"] > 0 and stats["served"] + stats["unserved"] == stats["saved"]
        assert stats["recomputed"] == stats["ops_recompute"] - stats["served"]
    else:
        assert stats["saved"] == 0 and stats["recomputed"] == stats["ops_recompute"]


def test_selective_counts_for_a_known_sequence():
    # Three bias-free linears on 2-D input -> three aten::mm: #0 and #2 saved, #1 recomputed (per phase).
    torch.manual_seed(0)
    w = torch.randn(8, 8, requires_grad=True)
    x = torch.randn(4, 8, requires_grad=True)
    fn = lambda t: torch.nn.functional.linear(torch.nn.functional.linear(torch.nn.functional.linear(t, w).relu(), w).relu(), w)
    hpac.reset_global_stats()
    # early_stop=False: the recompute runs to the end (stopped early, it ends before mm #2, which is then unserved).
    hpac.checkpoint(fn, x, policy="selective", early_stop=False).sum().backward()
    s = hpac.global_stats()
    assert s["saved"] == 2 and s["served"] == 2


def test_checkpoint_wrapper_keeps_state_dict_and_gradients(model_and_input):
    model, x = model_and_input
    keys = list(model.state_dict().keys())
    ref = run_step(model, x)
    for block in model:
        hpac.checkpoint_wrapper(block, policy="selective")
    assert list(model.state_dict().keys()) == keys
    hpac.reset_global_stats()
    got = run_step(model, x)  # plain calls: the wrapper checkpoints them
    assert hpac.global_stats()["served"] > 0
    assert_same([got[0], *got[2]], [ref[0], *ref[2]])
    with pytest.raises(RuntimeError, match="unknown policy kind 'sometimes'; allowed: full, selective"):
        hpac.checkpoint_wrapper(model[0], policy="sometimes")


def test_no_grad_forward_enters_no_region():
    hpac.reset_global_stats()
    with torch.no_grad():
        hpac.checkpoint(Block(), torch.randn(1, 4, 32), policy="selective")
    assert hpac.global_stats()["ops_forward"] == 0


def test_fallback_never_entered_outside_regions():
    before = torch.ops.hpac.fallback_entries()
    a = torch.randn(16, 16, requires_grad=True)
    (a @ a).softmax(-1).sum().backward()
    assert torch.ops.hpac.fallback_entries() == before
    inv = hpac.Invocation("full")
    with inv.region("forward"):
        torch.relu(a)
    assert torch.ops.hpac.fallback_entries() == before + 1
    assert inv.stats()["ops_forward"] == 1


def test_error_replay_mismatch_names_the_op():
    w = torch.randn(6, 6, requires_grad=True)
    calls = []

    def fn(t):
        calls.append(1)
        y = t @ w
        return y @ w if len(calls) > 1 else y.sin()  # the recompute runs one more mm

    # hold_saved=False: everything autograd saves here is kept or from outside, so hpac's frame would not re-run fn
    # at all (Note [Frames hold what needs no recompute]); the replay check is what this test is about.
    y = hpac.checkpoint(fn, torch.randn(3, 6, requires_grad=True), policy=["aten::mm"], hold_saved=False,
                        early_stop=False)  # to its end: stopped early it would end before the extra mm
    with pytest.raises(RuntimeError, match=r"aten::mm \(default overload\) occurrence 1 of invocation \d+ is not in storage"):
        y.sum().backward()


def test_error_backward_an_extra_time():
    w = torch.randn(6, 6, requires_grad=True)
    y = hpac.checkpoint(lambda t: (t @ w).tanh(), torch.randn(3, 6, requires_grad=True), policy="selective").sum()
    y.backward(retain_graph=True)
    with pytest.raises(RuntimeError, match=r"aten::mm .* was already served: backward ran .* an extra time"):
        y.backward()


def test_error_mutated_cache_and_allowed_mutation():
    w = torch.randn(6, 6, requires_grad=True)
    x = torch.randn(3, 6, requires_grad=True)
    fn = lambda t: t @ w  # its output is the saved output of aten::mm

    def step(ck, **kw):
        y = hpac.checkpoint(fn, x, policy=["aten::mm"], **kw) if ck else fn(x)
        y.mul_(2)  # user code mutates the region's output (the cached tensor) after the region
        return torch.autograd.grad(y.tanh().sum(), [x, w])

    # mm's backward reads its inputs only, which hpac's frame holds: no recompute runs, and the mutation is as
    # harmless as without a checkpoint (Note [Frames hold what needs no recompute]).
    ref = step(False)
    assert_same(step(True), ref)
    with pytest.raises(RuntimeError, match=r"cached output of aten::mm .* was modified in place"):
        step(True, hold_saved=False, early_stop=False)  # the recompute serves the mutated cache: refused
    assert_same(step(True, allow_cache_mutation=True, hold_saved=False, early_stop=False), ref)


def test_write_inside_the_region_to_a_cached_output_is_exact():
    w = torch.randn(6, 6, requires_grad=True)
    x = torch.randn(3, 6, requires_grad=True)

    def fn(t):
        y = t @ w
        y.add_(1.0)  # writes into the saved output of aten::mm: hpac keeps a private copy first
        return y.tanh()

    ref = torch.autograd.grad(fn(x).sum(), [x, w])
    got = torch.autograd.grad(hpac.checkpoint(fn, x, policy=["aten::mm"]).sum(), [x, w])
    assert_same(got, ref)


def test_write_through_unsafe_view_of_a_cached_output_is_exact():
    # matmul on a non-contiguous 3-D input is mm + _unsafe_view (torch 1.13) or expand + bmm + _unsafe_view (2.x);
    # add_ on the result writes into the cached output without bumping its version counter. hpac copies the entry
    # before the write (Note [Copy on write]).
    torch.manual_seed(0)
    w = torch.randn(8, 8, requires_grad=True)
    x = torch.randn(3, 2, 8, requires_grad=True)

    def fn(t):
        y = torch.matmul(t.transpose(0, 1), w)
        y.add_(1.0)
        return y.tanh()

    ref = torch.autograd.grad(fn(x).sum(), [x, w])
    hpac.reset_global_stats()
    got = torch.autograd.grad(hpac.checkpoint(fn, x, policy=["aten::mm", "aten::bmm"]).sum(), [x, w])
    assert hpac.global_stats()["served"] == 1
    assert_same(got, ref)


def test_error_nondeterministic_region():
    calls = []

    def fn(t):
        calls.append(1)
        return t.exp() if len(calls) == 1 else t.sin().cos()

    # early_stop=False: stopped after the first saved tensor, the recompute would not reach the difference.
    y = hpac.checkpoint(fn, torch.randn(4, requires_grad=True), policy="full", early_stop=False)
    with pytest.raises(RuntimeError, match="is not deterministic"):
        y.sum().backward()


def test_the_recompute_stops_early():
    """Note [The recompute stops early]: hpac.checkpoint's recompute ends once it has packed the last saved tensor
    the frame does not hold. exp, sin, exp, cos, mul, add: autograd saves a (exp its result, sin its argument before
    it runs) and c (the same by the second exp and cos). Full stops as cos saves c (3 ops; 4 where torch packs an
    op's argument after the op ran, as 1.13 does here); keeping the second exp's output lets the frame hold c, and
    the recompute stops as sin saves a (1 op, or 2). Gradients as without a checkpoint; the determinism check still
    covers the prefix it produced."""
    x = torch.randn(4, 4, requires_grad=True)
    fn = lambda t: t.exp().sin().exp().cos() * 2 + 1
    want = torch.autograd.grad(fn(x).sum(), [x])
    second_exp = hpac.PolicySpec("save_occurrences", ["aten::exp@1"])
    for policy, early_stop, ops_recompute in (("full", True, (3, 4)), ("full", False, (6,)),
                                              (second_exp, True, (1, 2)), (second_exp, False, (6,))):
        inv = hpac.Invocation(policy)
        got = torch.autograd.grad(checkpoint_with(inv, fn, x, early_stop=early_stop).sum(), [x])
        assert_same(got, want)
        s = inv.stats()
        assert (s["ops_forward"], s["recomputes"]) == (6, 1) and s["ops_recompute"] in ops_recompute, (policy,
                                                                                                   early_stop, s)
    calls = []

    def drifting(t):
        calls.append(1)
        return (t.exp() if len(calls) == 1 else t.sum(0).exp()).sin() * 2

    y = hpac.checkpoint(drifting, x, policy="full")
    with pytest.raises(RuntimeError, match="is not deterministic"):
        y.sum().backward()


def test_determinism_check_takes_torchs_values():
    """torch.utils.checkpoint's determinism_check values: "default" checks, "none" does not (a truthy string that
    must not leave the check on); the bools still work; anything else names what is allowed."""
    def region():
        calls = []

        def fn(t):
            calls.append(1)
            return t.exp() if len(calls) == 1 else t.sin().cos()
        return fn

    for value in ("default", True):
        y = hpac.checkpoint(region(), torch.randn(4, requires_grad=True), policy="full", determinism_check=value,
                            early_stop=False)
        with pytest.raises(RuntimeError, match="is not deterministic"):
            y.sum().backward()
    for value in ("none", False):
        y = hpac.checkpoint(region(), torch.randn(4, requires_grad=True), policy="full", determinism_check=value)
        y.sum().backward()  # unchecked: the recompute's different tensors go unnoticed
    with pytest.raises(ValueError, match="determinism_check 'sometimes' is not allowed; allowed: 'default', 'none'"):
        hpac.checkpoint(region(), torch.randn(4, requires_grad=True), determinism_check="sometimes")


def test_allow_cache_entry_mutation_is_torchs_name_with_the_old_alias():
    w = torch.randn(6, 6, requires_grad=True)
    x = torch.randn(3, 6, requires_grad=True)

    def step(**kw):
        y = hpac.checkpoint(lambda t: t @ w, x, policy=["aten::mm"], **kw)
        y.mul_(2)
        return torch.autograd.grad(y.tanh().sum(), [x, w])

    ref = torch.autograd.grad((2 * (x @ w)).tanh().sum(), [x, w])
    assert_same(step(allow_cache_entry_mutation=True), ref)
    assert_same(step(allow_cache_mutation=True), ref)
    with pytest.raises(ValueError, match="allow_cache_entry_mutation .* or its old alias allow_cache_mutation, not both"):
        step(allow_cache_entry_mutation=True, allow_cache_mutation=True)
    inv = hpac.Invocation(["aten::mm"], allow_cache_entry_mutation=True)
    assert inv.id > 0


def test_bad_policy_and_phase_are_rejected():
    with pytest.raises(RuntimeError, match="unknown policy kind 'sometimes'; allowed: full, selective, save_list"):
        hpac.Invocation("sometimes")
    with pytest.raises(RuntimeError, match="unknown policy kind 'sometimes'"):
        hpac.context_fn("sometimes")
    with pytest.raises(RuntimeError, match="save list entry 'aten::no_such_op'"):
        hpac.Invocation(["aten::no_such_op"])
    inv = hpac.Invocation("full")
    with pytest.raises(RuntimeError, match="unknown phase 'backward'; allowed: forward, recompute"):
        with inv.region("backward"):
            pass


def run_py(code, env_extra=None, preload=None):
    env = dict(os.environ, PYTHONPATH=PLUGIN_PY, HPAC_LIBRARY=LIB)
    env.pop("LD_PRELOAD", None)
    if preload:
        env["LD_PRELOAD"] = preload
    env.update(env_extra or {})
    return subprocess.run([PY, "-c", code], env=env, capture_output=True, text=True, timeout=300)


def test_error_key_already_owned_is_a_runtime_error():
    # The Python key already has a fallback (torch's own): hpac must refuse it and say so, not abort.
    r = run_py(
        "import torch, hpac\n"
        "print('status:', hpac.fallback_status())\n"
        "try:\n"
        "    hpac.checkpoint(lambda t: t.exp(), torch.randn(2, requires_grad=True))\n"
        "except RuntimeError as e:\n"
        "    print('RuntimeError:', e)\n",
        env_extra={"HPAC_DISPATCH_KEY": "Python"})
    assert r.returncode == 0, r.stderr
    assert "dispatch key Python already has a fallback" in r.stdout
    assert "RuntimeError: hpac: cannot enter a checkpoint region" in r.stdout


def test_bad_dispatch_key_env_is_reported():
    r = run_py("import torch, hpac\nprint(hpac.fallback_status())", env_extra={"HPAC_DISPATCH_KEY": "Nope"})
    assert r.returncode == 0, r.stderr
    assert "HPAC_DISPATCH_KEY='Nope' is not a dispatch key name" in r.stdout


def test_same_path_twice_is_a_noop():
    r = run_py(f"import torch\ntorch.ops.load_library({LIB!r})\ntorch.ops.load_library({LIB!r})\n"
               "print(torch.ops.hpac.fallback_status())")
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "registered"
    assert "already" not in r.stderr


def test_second_copy_reports_conflict_and_process_lives(tmp_path):
    copy = tmp_path / "libhpac_copy.so"
    shutil.copy(LIB, copy)
    r = run_py("import torch, hpac\n"
               f"torch.ops.load_library({str(copy)!r})\n"
               "w = torch.randn(4, 4, requires_grad=True)\n"
               "hpac.checkpoint(lambda t: (t @ w).tanh(), torch.randn(2, 4, requires_grad=True)).sum().backward()\n"
               "print('alive', hpac.fallback_status(), hpac.global_stats()['recomputes'])")
    assert r.returncode == 0, r.stderr
    assert "alive registered 1" in r.stdout
    assert "already has a fallback, owned by hpac loaded from " + LIB in r.stderr
    assert str(copy) in r.stderr


def test_library_built_for_another_torch_is_refused_naming_both_versions():
    foreign = os.environ.get("HPAC_FOREIGN_LIBRARY")
    if not foreign:
        pytest.skip("HPAC_FOREIGN_LIBRARY (a libhpac.so built for another torch) is set by tools/test.sh")
    built = hpac.built_for_torch(foreign)
    assert built is not None and _major_minor(built) != _major_minor(torch.__version__)
    r = run_py("import torch, hpac\n"
               "try:\n"
               f"    hpac.load({foreign!r})\n"
               "except RuntimeError as e:\n"
               "    print('RuntimeError:', e)\n"
               "print('alive')\n")
    assert r.returncode == 0, r.stderr
    assert f"was built for torch {built} but this Python runs torch {torch.__version__}" in r.stdout
    assert r.stdout.rstrip().endswith("alive")


def test_ld_preload_python_with_torch():
    r = run_py("import torch\nimport hpac\nprint(hpac.load() == " + repr(LIB) + ", hpac.fallback_status())\n"
               "w = torch.randn(4, 4, requires_grad=True)\n"
               "y = hpac.checkpoint(lambda t: (t @ w).tanh(), torch.randn(2, 4, requires_grad=True), policy='selective')\n"
               "y.sum().backward(); print(hpac.global_stats()['served'])", preload=LIB)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["True", "registered", "1"]


def test_ld_preload_python_without_torch():
    r = run_py("print('no torch here')", preload=LIB)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "no torch here"


def test_ld_preload_cpp_program_not_linked_to_hpac():
    probe = os.environ.get("HPAC_PRELOAD_PROBE")
    if not probe:
        pytest.skip("HPAC_PRELOAD_PROBE not set (run through ctest)")
    env = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}
    plain = subprocess.run([probe], capture_output=True, text=True, env=env, timeout=120)
    assert plain.stdout.strip() == "hpac ops: absent"
    preloaded = subprocess.run([probe], capture_output=True, text=True, env=dict(env, LD_PRELOAD=LIB), timeout=120)
    assert preloaded.returncode == 0, preloaded.stderr
    assert "hpac ops: present, version" in preloaded.stdout
    assert "fallback: registered" in preloaded.stdout


def _torch_at_least(major, minor):
    parts = torch.__version__.split("+")[0].split(".")
    return (int(parts[0]), int(parts[1])) >= (major, minor)


@pytest.mark.skipif(not _torch_at_least(2, 1), reason="torch.utils.checkpoint has no context_fn before torch 2.1 "
                                                       f"(this is torch {torch.__version__}); runs on torch >= 2.1")
@pytest.mark.parametrize("policy", ["full", "selective"])
def test_context_fn_with_torch_checkpoint(model_and_input, policy):
    from torch.utils.checkpoint import checkpoint as torch_checkpoint

    model, x0 = model_and_input

    def step(ck):
        for p in model.parameters():
            p.grad = None
        x = x0.clone().requires_grad_(True)
        torch.manual_seed(3)
        h = x
        for block in model:
            h = torch_checkpoint(block, h, use_reentrant=False, context_fn=hpac.context_fn(policy)) if ck else block(h)
        h.pow(2).mean().backward()
        return [x.grad] + [p.grad for p in model.parameters()]

    ref = step(False)
    hpac.reset_global_stats()
    got = step(True)
    assert_same(got, ref)
    stats = hpac.global_stats()
    assert stats["ops_recompute"] > 0
    if policy == "selective":
        assert stats["served"] > 0
