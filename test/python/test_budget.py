"""hpac.budget: the memory-budget policy from Python. Bit-for-bit gradient parity with a real no-checkpoint run under
every budget in {0, 0.25, 0.5, 0.75, 1} through hpac.checkpoint, checkpoint_wrapper and (torch >= 2.1) context_fn;
the region's status; a MoE block whose routing changes the op sequence re-profiles, then falls back to the fixed
selective policy with one warning; bad budgets are clear errors."""
import warnings

import pytest
import torch

import hpac
from hpac._loader import _major_minor
from hpac.harness import checkpoint_with
from hpac.harness.blocks import Block
from hpac.harness.parity import assert_same, compare

BUDGETS = (0.0, 0.25, 0.5, 0.75, 1.0)
HAS_CONTEXT_FN = _major_minor(torch.__version__) >= (2, 1)


def _model():
    torch.manual_seed(0)
    return torch.nn.Sequential(Block(), Block())


def _step(model, x0, run_block):
    """One forward + backward of the two blocks, each through run_block(i, block, h); dropout seeded."""
    model.zero_grad(set_to_none=True)
    x = x0.clone().requires_grad_(True)
    torch.manual_seed(3)
    h = x
    for i, block in enumerate(model):
        h = run_block(i, block, h)
    h.pow(2).mean().backward()
    return [x.grad] + [p.grad for p in model.parameters()]


def _cases():
    """Every budget through hpac.checkpoint; the other two front-ends at one budget (the policy is the same)."""
    cases = [(f, "checkpoint") for f in BUDGETS] + [(0.5, "wrapper")]
    if HAS_CONTEXT_FN:
        cases += [(0.5, "context_fn"), (1.0, "context_fn")]
    return cases


@pytest.mark.parametrize("fraction, path", _cases())
def test_every_budget_matches_no_checkpointing_bit_for_bit(fraction, path):
    model = _model()
    torch.manual_seed(5)
    x0 = torch.randn(2, 16, 32)
    ref = _step(model, x0, lambda i, block, h: block(h))
    budgets = [hpac.budget(fraction), hpac.budget(fraction)]  # one region per block

    if path == "checkpoint":
        def run(i, block, h):
            return hpac.checkpoint(block, h, policy=budgets[i])
    elif path == "context_fn":
        from torch.utils.checkpoint import checkpoint as torch_checkpoint
        fns = [hpac.context_fn(b) for b in budgets]

        def run(i, block, h):
            return torch_checkpoint(block, h, use_reentrant=False, context_fn=fns[i])
    else:
        for block, b in zip(model, budgets):
            hpac.checkpoint_wrapper(block, policy=b)

        def run(i, block, h):
            return block(h)

    for step in range(3):  # the profile, then the plan replayed twice
        hpac.reset_global_stats()
        got = _step(model, x0, run)
        assert_same(got, ref, names=["input"] + [n for n, _ in model.named_parameters()])
        stats = hpac.global_stats()
        if fraction == 1.0 and step and path != "context_fn":
            # Note [Frames hold what needs no recompute]: the plan covers what off keeps; hpac's frame holds it all
            assert (stats["recomputes"], stats["served"], stats["skipped"]) == (0, 0, 0) and stats["held"] > 0
        else:
            assert stats["recomputes"] == 2
        if step == 0:
            assert stats["saved"] == 0  # the profile runs as full
    for b in budgets:
        st = b.status()
        assert st["stage"] == "planned" and st["profiles"] == 1 and st["replans"] == 0
        assert st["profiled_ops"] == st["planned_ops"] > 0
        assert 0 < st["off_bytes"] < st["total_bytes"]  # the saved-tensor hook reported (Note [What off keeps])
        assert st["kept_bytes"] <= st["budget_bytes"] == int(fraction * st["off_bytes"])
        assert 0 <= st["saved_micros"] <= st["total_micros"]
    if fraction == 0.0:  # only outputs without bytes (scalars) are kept
        assert all(b.status()["kept_bytes"] == 0 for b in budgets)
    if fraction == 1.0 and path == "context_fn":  # torch's frame recomputes, serving what the plan kept
        assert stats["served"] > 0
        # Note [Dead ops are skipped]: what only fed the kept outputs is not run again; torch's early stop ends the
        # recompute once backward has what it needs, before the last skip-marked ops
        assert 0 < stats["skipped"] <= sum(b.status()["skipped_ops"] for b in budgets)
    if fraction == 1.0:
        assert all(0 < b.status()["kept_bytes"] <= b.status()["off_bytes"] for b in budgets)
    assert stats["saved"] == sum(b.status()["saved_ops"] for b in budgets)


def _chain():
    """x, w1, w2 and tanh(relu(x @ w1) @ w2).sum(): 16 x 64 fp32 activations, counted by hand in the tests below."""
    torch.manual_seed(3)
    x = torch.randn(16, 32, requires_grad=True)
    w1 = torch.randn(32, 64, requires_grad=True)
    w2 = torch.randn(64, 64, requires_grad=True)
    return x, w1, w2, lambda t: torch.tanh(torch.relu(t @ w1) @ w2).sum()


@pytest.mark.parametrize("path", ["checkpoint", "context_fn"] if HAS_CONTEXT_FN else ["checkpoint"])
def test_one_is_what_checkpointing_off_keeps(path):
    """Note [What off keeps], counted by hand: relu and tanh save their results (16 x 64 fp32 each); the matmuls
    save their operands (the region's input, the weights, relu's result); sum saves no tensor."""
    x, w1, w2, fn = _chain()
    b = hpac.budget(1.0)
    for _ in range(2):
        if path == "checkpoint":
            out = hpac.checkpoint(fn, x, policy=b)
        else:
            from torch.utils.checkpoint import checkpoint as torch_checkpoint
            out = torch_checkpoint(fn, x, use_reentrant=False, context_fn=hpac.context_fn(b))
        out.backward()
    activation = 16 * 64 * 4
    st = b.status()
    assert st["stage"] == "planned"
    assert st["off_bytes"] == 2 * activation
    assert st["total_bytes"] == 4 * activation + 4  # both matmul results, relu, tanh, the sum's scalar
    assert st["kept_bytes"] <= st["budget_bytes"] == 2 * activation


@pytest.mark.parametrize("skip_dead", [True, False])
def test_ops_nothing_backward_needs_are_skipped_unless_told_not_to(skip_dead):
    """Note [Dead ops are skipped], counted by hand: at 1.0 the plan keeps relu's and tanh's results (what autograd
    saves), so the two matmuls and the sum only fed kept outputs: 3 skipped, 2 served, none run. skip_dead=False:
    the 3 run again."""
    x, w1, w2, fn = _chain()
    ref = torch.autograd.grad(fn(x), [x, w1, w2])
    b = hpac.budget(1.0, skip_dead=skip_dead)
    for step in range(3):
        hpac.reset_global_stats()
        # hold_saved=False: the recompute runs although the plan keeps what off keeps (Note [Frames hold what needs
        # no recompute]), as it does under torch.utils.checkpoint's frame, and to its end (early_stop=False).
        assert_same(torch.autograd.grad(hpac.checkpoint(fn, x, policy=b, hold_saved=False, early_stop=False),
                                        [x, w1, w2]), ref)
        stats = hpac.global_stats()
        if step:
            assert (stats["served"], stats["skipped"], stats["recomputed"]) == ((2, 3, 0) if skip_dead else (2, 0, 3))
    assert b.status()["skipped_ops"] == (3 if skip_dead else 0)


def _normed_chain():
    """_chain with a layer norm on top: its mean and rstd are what autograd saves of it, never its output."""
    x, w1, w2, _ = _chain()
    return x, w1, w2, lambda t: torch.layer_norm(torch.tanh(torch.relu(t @ w1) @ w2), (64,)).sum()


def test_a_budget_that_covers_off_recomputes_nothing():
    """Note [Frames hold what needs no recompute]: at 1.0 hpac's frame holds every tensor autograd saves, as off
    does, so backward never re-runs the region: no recompute phase, nothing served, off's gradients bit for bit, and
    the bytes live after the forward are off's exactly. With hold_saved=False the recompute runs as before."""
    hpac.track_memory()
    x, w1, w2, fn = _normed_chain()

    def live_after_forward(run):
        start = hpac.cpu_tensor_memory_stats()["current_bytes"]
        out = run()
        live = hpac.cpu_tensor_memory_stats()["current_bytes"] - start
        return live, torch.autograd.grad(out, [x, w1, w2])

    off_live, off_grads = live_after_forward(lambda: fn(x))
    for hold in (True, False):
        b = hpac.budget(1.0)
        for step in range(3):
            hpac.reset_global_stats()
            live, grads = live_after_forward(lambda: hpac.checkpoint(fn, x, policy=b, hold_saved=hold))
            assert_same(grads, off_grads)
            stats = hpac.global_stats()
            if step == 0:
                continue  # the profile
            if hold:
                # mm x2 (2 operands each), relu, tanh, layer_norm (input, mean, rstd): 9 saved tensors, all held
                assert (stats["recomputes"], stats["served"], stats["held"]) == (0, 0, 9)
                assert live == off_live, (live, off_live)
            else:
                assert stats["recomputes"] == 1 and stats["held"] == 0 and stats["served"] > 0


def test_what_a_frame_holds_needs_no_recompute_under_every_policy():
    """Note [Frames hold what needs no recompute]: under selective and full the frame still holds the region's
    input and the weights (made outside it), and under save_all everything (kept anyway): save_all never re-runs the
    region; the others do. Gradients are off's in every case."""
    x, w1, w2, fn = _normed_chain()
    off = torch.autograd.grad(fn(x), [x, w1, w2])
    for policy, recomputes in (("full", 1), ("selective", 1), ("save_all", 0)):
        inv = hpac.Invocation(policy)
        assert_same(torch.autograd.grad(checkpoint_with(inv, fn, x), [x, w1, w2]), off)
        stats = inv.stats()
        assert stats["recomputes"] == recomputes, (policy, stats)
        assert stats["held"] >= 3, (policy, stats)  # x, w1, w2


def test_a_held_tensor_written_after_the_forward_is_an_error_as_without_a_checkpoint():
    """A saved tensor held by the frame and modified in place before backward: autograd refuses that without a
    checkpoint; so does hpac's frame once nothing is left to recompute, naming the tensor and its versions."""
    x, w1, w2, _ = _chain()
    fn = lambda t: torch.tanh(t @ w1)  # noqa: E731 -- tanh saves its result, which the caller then writes
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        y = fn(x)
        y.add_(1)
        y.sum().backward()
    b = hpac.budget(1.0)
    hpac.checkpoint(fn, x, policy=b).sum().backward()  # the profile
    y = hpac.checkpoint(fn, x, policy=b)
    y.add_(1)
    with pytest.raises(RuntimeError, match=r"saved tensor #\d+ \(\(16, 64\) torch.float32\) was modified by an "
                                           r"in-place operation after the forward saved it for backward \(version 0, "
                                           r"now 1\)"):
        y.sum().backward()


def test_integer_results_python_reads_back_are_never_skipped():
    """Note [Dead ops are skipped]: an expert-parallel MoE sizes its all-to-all with token counts read back by
    tolist(), which no op the region sees reads. Autograd saves nothing of bincount's result, so it feeds nothing
    backward needs (at budget 0 nothing is kept, so the plan does not depend on the timings); skipped, the
    recompute split by uninitialised sizes. Integer results always run."""
    torch.manual_seed(5)
    x = torch.randn(24, 16, requires_grad=True)
    w = torch.randn(16, 16, requires_grad=True)
    route = torch.randint(0, 3, (24,))

    def fn(t):
        sizes = torch.bincount(route, minlength=3).tolist()
        parts = (t[torch.argsort(route, stable=True)] @ w).split(sizes)
        return sum(torch.tanh(p).sum() * (i + 1) for i, p in enumerate(parts))

    ref = torch.autograd.grad(fn(x), [x, w])
    b = hpac.budget(0.0)
    for _ in range(3):
        hpac.reset_global_stats()
        assert_same(torch.autograd.grad(hpac.checkpoint(fn, x, policy=b), [x, w]), ref)
    assert b.status()["stage"] == "planned" and hpac.global_stats()["skipped"] > 0  # the sums, for one


def test_estimated_costs_count_what_an_op_computes_and_moves():
    """Note [Estimated op costs], counted by hand on _chain(): mm [16, 32] x [32, 64] is 2·16·32·64 flops and moves
    its arguments and result (16·32 + 32·64 + 16·64 floats); relu moves 2 x 16·64 floats and computes nothing the
    model counts. The estimate is the roofline's: more flops or bytes, more time."""
    x, w1, w2, fn = _chain()
    b = hpac.budget(0.5, cost="estimated")
    hpac.checkpoint(fn, x, policy=b).backward()
    ops = {(p["op"], p["occurrence"]): p for p in b.profile()}
    mm, relu = ops[("aten::mm", 0)], ops[("aten::relu", 0)]
    assert mm["flops"] == 2 * 16 * 32 * 64 and mm["bytes_moved"] == 4 * (16 * 32 + 32 * 64 + 16 * 64)
    assert relu["flops"] == 0 and relu["bytes_moved"] == 4 * 2 * 16 * 64
    assert ops[("aten::mm", 1)]["flops"] == 2 * 16 * 64 * 64 > mm["flops"]
    assert ops[("aten::mm", 1)]["estimated_micros"] > mm["estimated_micros"] > 0
    # The plan weighs each op by its estimate.
    assert all(p["micros"] == p["estimated_micros"] for p in b.profile())


def _fresh_python(code, **env):
    """Runs `code` in a new Python process (the roofline is measured once per process) with the hpac this test
    imported; returns the CompletedProcess."""
    import os
    import subprocess
    import sys
    package = os.path.dirname(os.path.dirname(os.path.abspath(hpac.__file__)))
    path = os.pathsep.join([package] + ([os.environ["PYTHONPATH"]] if os.environ.get("PYTHONPATH") else []))
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env=dict(os.environ, PYTHONPATH=path, **env))


_PINNED = """
import torch, hpac
x = torch.randn(16, 32, requires_grad=True)
w = torch.randn(32, 64, requires_grad=True)
b = hpac.budget(0.5, cost="estimated")
hpac.checkpoint(lambda t: torch.relu(t @ w).sum(), x, policy=b).backward()
print({p["op"]: p["estimated_micros"] for p in b.profile()})
"""


@pytest.mark.parametrize("roofline, expected", [
    # mm: max(65536 flops / 1000, 4 * (512 + 2048 + 1024) bytes / 100); relu: 2 * 4096 bytes / 100.
    ("1000:100", {"aten::mm": 143.36, "aten::relu": 81.92}),
    # compute bound at 10 flops per µs
    ("10:100000", {"aten::mm": 6553.6, "aten::relu": 0.08192}),
    ("1000", "hpac: HPAC_ROOFLINE '1000' is not allowed; allowed: <flops per µs>:<bytes per µs>"),
    ("0:5", "hpac: HPAC_ROOFLINE '0:5' is not allowed"),
])
def test_a_pinned_roofline_gives_the_estimate_by_hand(roofline, expected):
    """Note [Estimated op costs]: HPAC_ROOFLINE pins the rates (in a fresh process: the roofline is measured once per
    process); bad values name themselves and the form."""
    p = _fresh_python(_PINNED, HPAC_ROOFLINE=roofline)
    if isinstance(expected, str):
        assert p.returncode != 0 and expected in p.stderr, p.stderr[-2000:]
        return
    assert p.returncode == 0, p.stderr[-2000:]
    got = eval(p.stdout.strip().splitlines()[-1])
    for op, micros in expected.items():
        assert got[op] == pytest.approx(micros, rel=1e-9), (op, got)


_PROFILE_PEAK = """
import torch, hpac
hpac.track_memory()
x = torch.randn(16, 32, requires_grad=True)
w = torch.randn(32, 64, requires_grad=True)
b = hpac.budget(0.5)
hpac.reset_cpu_tensor_peak()
start = hpac.cpu_tensor_memory_stats()["current_bytes"]
hpac.checkpoint(lambda t: torch.relu(t @ w).sum(), x, policy=b).backward()
print(hpac.cpu_tensor_memory_stats()["peak_bytes"] - start)
"""


def test_the_roofline_is_measured_before_the_first_profile():
    """Note [The roofline is measured outside regions]: in a fresh process, the first profiled step of a small region
    allocates what the region allocates (a few KiB), not the calibration's buffers (2 x 32 MiB)."""
    p = _fresh_python(_PROFILE_PEAK)
    assert p.returncode == 0, p.stderr[-2000:]
    peak = int(p.stdout.strip().splitlines()[-1])
    assert 0 < peak < 1 << 20, peak


def test_estimated_cost_makes_the_same_plan_in_every_run():
    """Three fresh regions at one budget: with cost='estimated' the plans are the same text (the estimate does not
    depend on the timings), and training through it matches no checkpointing bit for bit."""
    model = _model()
    x0 = torch.randn(2, 8, 32)
    ref = _step(model, x0, lambda i, block, h: block(h))
    texts = []
    for run in range(3):
        budgets = [hpac.budget(0.5, cost="estimated") for _ in model]
        for _ in range(2):
            got = _step(model, x0, lambda i, block, h: hpac.checkpoint(block, h, policy=budgets[i]))
            assert_same(got, ref)
        texts.append([b._region.plan_text() for b in budgets])
    assert texts[0] == texts[1] == texts[2]


def test_status_before_the_first_call_and_a_budget_in_bytes():
    b = hpac.budget(bytes=0)
    assert b.stage == "profiling"
    assert b.status()["profiles"] == 0 and b.status()["kept_bytes"] == 0
    model = _model()
    torch.manual_seed(5)
    x0 = torch.randn(1, 8, 32)
    ref = _step(model, x0, lambda i, block, h: block(h))
    big = hpac.budget(bytes=1 << 40)
    for _ in range(2):
        got = _step(model, x0, lambda i, block, h: hpac.checkpoint(block, h, policy=big if i else b))
        assert_same(got, ref)
    assert b.status()["kept_bytes"] == 0 and b.status()["budget_bytes"] == 0
    assert big.status()["kept_bytes"] == big.status()["total_bytes"] > 0  # more than everything: keep all
    assert "stage='planned'" in repr(big)


def _experts_hit(block, x):
    with torch.no_grad():
        h = x + block.self_attn(block.input_layernorm(x))
        flat = block.post_attention_layernorm(h).reshape(-1, x.shape[-1])
        chosen = torch.topk(torch.softmax(block.mlp.gate(flat), -1), block.mlp.top_k, dim=-1).indices
    return len(set(chosen.reshape(-1).tolist()))


def test_moe_routing_that_changes_the_ops_reprofiles_then_falls_back_with_one_warning():
    # The block loops over the experts hit only, so the op sequence follows the routing.
    torch.manual_seed(1)
    block = torch.nn.Sequential(Block(experts=8, top_k=1, dropout=0.0))
    torch.manual_seed(2)
    varied = torch.randn(1, 12, 32)
    same = varied[:, :1].expand(1, 12, 32).contiguous()  # one token repeated: one expert hit
    two = torch.cat([varied[:, :1].expand(1, 6, 32), varied[:, 1:2].expand(1, 6, 32)], 1).contiguous()
    counts = [_experts_hit(block[0], x) for x in (varied, same, two)]
    assert len(set(counts)) == 3, f"the inputs must hit different numbers of experts, got {counts}"

    budget = hpac.budget(0.5, max_replans=1)

    def step(x):
        ref = _step(block, x, lambda i, blk, h: blk(h))
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            got = _step(block, x, lambda i, blk, h: hpac.checkpoint(blk, h, policy=budget))
        # Experts not hit have no gradient on either side; every other tensor bit for bit, NaN never equal.
        assert compare(got, ref, allow_missing=True) == (0.0, "")
        return [str(w.message) for w in caught if "hpac budget" in str(w.message)]

    assert step(varied) == [] and budget.stage == "planned"
    assert step(varied) == [] and budget.stage == "planned"  # same routing: the plan replays
    assert step(same) == []  # other ops: fixed policy for this call, and the region profiles again
    assert budget.stage == "profiling" and budget.status()["replans"] == 1
    assert step(same) == [] and budget.stage == "planned"  # the new profile
    fell_back = step(two)  # differs again, no replans left
    assert budget.stage == "fallback (fixed selective policy)"
    assert len(fell_back) == 1 and "keeps the fixed selective policy" in fell_back[0]
    hpac.reset_global_stats()
    assert step(varied) == [] and step(same) == []  # stays on the fixed policy, silently
    assert hpac.global_stats()["served"] > 0  # the selective rules keep the matmuls
    assert budget.status()["replans"] == 1


@pytest.mark.parametrize("args, kwargs, error, message", [
    ((1.5,), {}, RuntimeError, "hpac budget: fraction 1.5 is outside [0, 1]"),
    ((-0.25,), {}, RuntimeError, "hpac budget: fraction -0.25 is outside [0, 1]"),
    ((), {"bytes": -5}, RuntimeError, "hpac budget: bytes -5 is negative; allowed: >= 0"),
    ((), {"bytes": -1}, RuntimeError, "hpac budget: bytes -1 is negative; allowed: >= 0"),
    ((), {}, RuntimeError, "give exactly one of a fraction in [0, 1] or a number of bytes (got neither)"),
    ((0.5,), {"bytes": 10}, RuntimeError, "(got both)"),
    ((0.5,), {"max_replans": -1}, RuntimeError, "max_replans -1 is negative"),
    (("0.5",), {}, TypeError, "hpac.budget: fraction '0.5' is a str; allowed: a number in [0, 1]"),
    ((), {"bytes": 1.5}, TypeError, "hpac.budget: bytes 1.5 is a float; allowed: an int"),
    ((0.5,), {"cost": "fast"}, RuntimeError, "hpac budget: cost 'fast' is not allowed; allowed: measured (the "
                                             "profiled kernel times), estimated"),
    ((0.5,), {"cost": None}, TypeError, "hpac.budget: cost None is a NoneType; allowed: 'measured' or 'estimated'"),
    ((0.5,), {"profile_invocations": 0}, RuntimeError, "profile_invocations 0 is not allowed; allowed: >= 1"),
])
def test_bad_budgets_name_the_value_and_what_is_allowed(args, kwargs, error, message):
    with pytest.raises(error) as e:
        hpac.budget(*args, **kwargs)
    assert message in str(e.value)


def test_checkpoint_wrapper_names_what_it_takes():
    # Checked when wrapped, in C++ as every policy is: "budget" is no kind (a budget is hpac.budget(...)).
    with pytest.raises(RuntimeError, match=r"unknown policy kind 'budget'; allowed: full, selective"):
        hpac.checkpoint_wrapper(torch.nn.Linear(2, 2), policy="budget")


def test_a_saved_plan_replays_in_a_new_region_without_a_profile(tmp_path):
    """Note [Plan files]: Budget.save_plan, then hpac.budget(plan=...) replays it from its first call, bit for bit
    with off; a region it does not match is an error naming the plan; bad plans and arguments are clear errors."""
    model = _model()
    torch.manual_seed(5)
    x0 = torch.randn(2, 16, 32)
    ref = _step(model, x0, lambda i, block, h: block(h))
    made = [hpac.budget(0.5), hpac.budget(0.5)]
    for _ in range(2):  # the profile, then one replay
        hpac.reset_global_stats()
        _step(model, x0, lambda i, block, h: hpac.checkpoint(block, h, policy=made[i]))
    replayed = hpac.global_stats()
    paths = [tmp_path / f"layer{i}.plan" for i in range(2)]
    for b, path in zip(made, paths):
        b.save_plan(path)
    loaded = [hpac.budget(plan=path) for path in paths]
    assert all(b.stage == "planned" and b.status()["profiles"] == 0 for b in loaded)
    assert [b.status()["kept_bytes"] for b in loaded] == [b.status()["kept_bytes"] for b in made]
    hpac.reset_global_stats()
    got = _step(model, x0, lambda i, block, h: hpac.checkpoint(block, h, policy=loaded[i]))
    assert_same(got, ref)
    stats = hpac.global_stats()
    assert stats["saved"] == replayed["saved"] > 0 and stats["served"] == replayed["served"]
    assert f"plan='{paths[0]}'" in repr(loaded[0])

    # The plan of a two-block region does not match one block.
    pair = hpac.budget(plan=paths[0])
    with pytest.raises(RuntimeError, match=r"the plan '.*layer0.plan' does not match the region: its op \d+ is "):
        x = x0.clone().requires_grad_(True)
        hpac.checkpoint(lambda h: model[1](model[0](h)), x, policy=pair).sum().backward()

    bad = tmp_path / "bad.plan"
    bad.write_text("hpac-budget-plan 1\nbudget_bytes lots\n")
    with pytest.raises(RuntimeError, match=r"bad.plan' line 2: 'budget_bytes lots' is not 'budget_bytes <number>'"):
        hpac.budget(plan=bad)
    with pytest.raises(FileNotFoundError, match="no-such.plan"):
        hpac.budget(plan=tmp_path / "no-such.plan")
    with pytest.raises(ValueError, match="carries its budget; give either plan= or a fraction / bytes"):
        hpac.budget(0.5, plan=paths[0])
    with pytest.raises(RuntimeError, match=r"has no plan to save \(stage 'profiling'\)"):
        hpac.budget(0.5).save_plan(tmp_path / "early.plan")
