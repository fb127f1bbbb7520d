"""The contract of torch.utils.checkpoint.create_selective_checkpoint_contexts, as PyTorch documents it, run twice:
once with torch's implementation and once with hpac.create_selective_checkpoint_contexts (the one-line switch,
`functools.partial(<impl>, policy_fn)` as context_fn). Written from the documented contract, not copied from
PyTorch's tests. Every case checks gradients against a real no-checkpoint run (bitwise on fp32 CPU) and, where the
contract is about what runs again, counts what ran in the recompute with an outer dispatch mode around backward
(hpac: Note [Outer dispatch modes see what ran], plugin/python/hpac/_policy_fn.py).

Cases: bad inputs (not a function or list; a list with non-ops; a policy that raises or returns a non-policy; CPU
offload), bool and CheckpointPolicy answers, MUST/PREFER alike in eager, list of OpOverloads, stateful and
occurrence-dependent policies, complements, decisions from arguments, the function asked in the forward only, the
context's op_output, multiple and non-tensor outputs, version counter (mutation after the region), writes inside
the region into a saved output (where hpac differs: it copies on write), recompute-once (a second backward), storage
released after backward, FlopCounterMode and a logging mode around backward, memory kept after forward, and
torch.compile with MUST_SAVE / MUST_RECOMPUTE / custom rules through a partial context_fn.
"""
import functools

import pytest
import torch

import hpac
from hpac._loader import _major_minor
from hpac.harness.parity import assert_same

pytestmark = pytest.mark.skipif(
    _major_minor(torch.__version__) < (2, 4),
    reason=f"create_selective_checkpoint_contexts with CheckpointPolicy needs torch >= 2.4 (this is "
           f"{torch.__version__})")

if _major_minor(torch.__version__) >= (2, 4):
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils.checkpoint import CheckpointPolicy, checkpoint
    from torch.utils.flop_counter import FlopCounterMode

    IMPLS = {"torch": torch.utils.checkpoint.create_selective_checkpoint_contexts,
             "hpac": hpac.create_selective_checkpoint_contexts}
    aten = torch.ops.aten
else:
    IMPLS = {}

impls = pytest.mark.parametrize("impl", ["torch", "hpac"])


class OpCounter(TorchDispatchMode if IMPLS else object):
    """Counts the aten ops that reach it, by OpOverloadPacket name ('mm', 'sigmoid')."""

    def __init__(self):
        super().__init__()
        self.counts = {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.overloadpacket.__name__
        self.counts[name] = self.counts.get(name, 0) + 1
        return func(*args, **(kwargs or {}))


def chain(x, w):
    """Three matmuls with pointwise ops between: mm, sigmoid, mm, mul, mm, tanh."""
    a = torch.mm(x, w)
    b = torch.sigmoid(a)
    c = torch.mm(b, w)
    d = c * b
    e = torch.mm(d, w)
    return torch.tanh(e)


def inputs(n=8):
    torch.manual_seed(0)
    return torch.randn(n, n, requires_grad=True), torch.randn(n, n, requires_grad=True)


def grads(fn, x, w):
    out = fn(x, w)
    out.sum().backward()
    g = [x.grad.clone(), w.grad.clone()]
    x.grad = w.grad = None
    return out.detach(), g


def run(impl, policy, fn=chain, count=False, allow=False, n=8):
    """The ops that ran again in the recompute ({name: count}: what an OpCounter around backward saw, less what it
    sees around the same backward without checkpointing) under impl's SAC with `policy`; asserts parity with no
    checkpointing."""
    x, w = inputs(n)
    out = fn(x, w)
    plain = OpCounter()
    with plain:
        out.sum().backward()
    ref_out, ref_grads = out.detach(), [x.grad.clone(), w.grad.clone()]
    x.grad = w.grad = None
    context_fn = functools.partial(IMPLS[impl], policy, allow)
    out = checkpoint(fn, x, w, use_reentrant=False, context_fn=context_fn)
    counter = OpCounter()
    if count:
        with counter:
            out.sum().backward()
    else:
        out.sum().backward()
    got = [x.grad, w.grad]
    assert_same(out.detach(), ref_out)
    assert_same(got, ref_grads, names=["x.grad", "w.grad"])
    if not count:
        return {}
    names = set(counter.counts) | set(plain.counts)
    again = {k: counter.counts.get(k, 0) - plain.counts.get(k, 0) for k in names if k != "detach"}
    return {k: v for k, v in again.items() if v}


def recomputed_mm(counts):
    return counts.get("mm", 0)


def every_mm_but_the_second():
    """A stateful policy: every mm saved but the 2nd (MUST_RECOMPUTE), everything else PREFER_RECOMPUTE; returns
    (policy, seen), seen["mm"] the mms it was asked about."""
    seen = {"mm": 0}

    def policy(ctx, op, *args, **kwargs):
        if op != aten.mm.default:
            return CheckpointPolicy.PREFER_RECOMPUTE
        seen["mm"] += 1
        return CheckpointPolicy.MUST_RECOMPUTE if seen["mm"] == 2 else CheckpointPolicy.MUST_SAVE

    return policy, seen


# ---- bad input -------------------------------------------------------------------------------------------------


@impls
def test_neither_function_nor_list_is_refused(impl):
    with pytest.raises(TypeError, match="function or a list"):
        IMPLS[impl](42)


@impls
def test_list_with_a_non_op_is_refused(impl):
    with pytest.raises(ValueError):
        IMPLS[impl]([torch.ops.aten.mm.default, 3.5])


def test_list_with_an_op_packet():
    """torch refuses an OpOverloadPacket in the list; hpac takes it as every overload of the op (a documented
    difference: docs/python.md, 'From PyTorch's SAC')."""
    with pytest.raises(ValueError, match="OpOverload"):
        IMPLS["torch"]([torch.ops.aten.mm])
    counts = run("hpac", [torch.ops.aten.mm], count=True)
    assert recomputed_mm(counts) == 0


@impls
def test_policy_that_raises_stops_the_forward(impl):
    def policy(ctx, op, *args, **kwargs):
        if op == aten.mul.Tensor:
            raise KeyError("no rule for mul")
        return CheckpointPolicy.PREFER_RECOMPUTE

    x, w = inputs()
    with pytest.raises(Exception, match="no rule for mul") as raised:
        checkpoint(chain, x, w, use_reentrant=False, context_fn=functools.partial(IMPLS[impl], policy))
    if impl == "hpac":  # hpac names the op and occurrence
        assert "aten.mul.Tensor (occurrence 0" in str(raised.value)


def test_policy_returning_a_non_policy_is_refused_naming_the_op():
    def policy(ctx, op, *args, **kwargs):
        return "save" if op == aten.mm.default else CheckpointPolicy.PREFER_RECOMPUTE

    x, w = inputs()
    with pytest.raises(TypeError, match=r"returned 'save' \(str\) for aten.mm.default \(occurrence 0.*allowed"):
        checkpoint(chain, x, w, use_reentrant=False,
                   context_fn=functools.partial(hpac.create_selective_checkpoint_contexts, policy))


def test_cpu_offload_is_refused_with_the_alternative():
    def policy(ctx, op, *args, **kwargs):
        return CheckpointPolicy.MUST_CPU_OFFLOAD if op == aten.mm.default else CheckpointPolicy.PREFER_RECOMPUTE

    x, w = inputs()
    with pytest.raises(RuntimeError, match="MUST_CPU_OFFLOAD for aten.mm.default.*save_on_cpu"):
        checkpoint(chain, x, w, use_reentrant=False,
                   context_fn=functools.partial(hpac.create_selective_checkpoint_contexts, policy))


# ---- what is saved, what runs again ----------------------------------------------------------------------------


@impls
def test_list_of_overloads_saves_those(impl):
    counts = run(impl, [aten.mm.default], count=True)
    assert recomputed_mm(counts) == 0
    assert counts.get("sigmoid", 0) == 1  # recomputed


@impls
@pytest.mark.parametrize("answer", ["MUST_SAVE", "PREFER_SAVE", True])
def test_save_answers_alike_in_eager(impl, answer):
    value = getattr(CheckpointPolicy, answer) if isinstance(answer, str) else answer

    def policy(ctx, op, *args, **kwargs):
        return value if op == aten.mm.default else CheckpointPolicy.PREFER_RECOMPUTE

    assert recomputed_mm(run(impl, policy, count=True)) == 0


@impls
@pytest.mark.parametrize("answer", ["MUST_RECOMPUTE", "PREFER_RECOMPUTE", False])
def test_recompute_answers_alike_in_eager(impl, answer):
    value = getattr(CheckpointPolicy, answer) if isinstance(answer, str) else answer

    def policy(ctx, op, *args, **kwargs):
        return value

    counts = run(impl, policy, count=True)
    assert recomputed_mm(counts) == 3


@impls
def test_stateful_policy_every_mm_but_the_second(impl):
    policy, seen = every_mm_but_the_second()
    counts = run(impl, policy, count=True)
    assert recomputed_mm(counts) == 1
    assert seen["mm"] == 3  # asked in the forward only


@impls
def test_complement_save_all_but_mul_and_sigmoid(impl):
    def policy(ctx, op, *args, **kwargs):
        if op in (aten.mul.Tensor, aten.sigmoid.default):
            return CheckpointPolicy.MUST_RECOMPUTE
        return CheckpointPolicy.MUST_SAVE

    counts = run(impl, policy, count=True)
    assert recomputed_mm(counts) == 0
    assert counts.get("sigmoid", 0) == 1 and counts.get("mul", 0) == 1


@impls
def test_decision_from_arguments(impl):
    """Save an mm only when its second argument is the (8, 8) weight: all three here; none with another shape."""
    def policy(ctx, op, *args, **kwargs):
        save = op == aten.mm.default and tuple(args[1].shape) == (8, 8)
        return CheckpointPolicy.MUST_SAVE if save else CheckpointPolicy.PREFER_RECOMPUTE

    assert recomputed_mm(run(impl, policy, count=True, n=8)) == 0
    assert recomputed_mm(run(impl, policy, count=True, n=6)) == 3


@impls
def test_policy_sees_the_op_output_and_not_the_recompute(impl):
    calls = []

    def policy(ctx, op, *args, **kwargs):
        calls.append((op, ctx.is_recompute, tuple(ctx.op_output.shape) if isinstance(ctx.op_output, torch.Tensor)
                      else None))
        return CheckpointPolicy.MUST_SAVE if op == aten.mm.default else CheckpointPolicy.PREFER_RECOMPUTE

    run(impl, policy)
    assert calls and not any(recompute for _, recompute, _ in calls)
    assert [shape for op, _, shape in calls if op == aten.mm.default] == [(8, 8)] * 3
    assert sum(op == aten.mm.default for op, _, _ in calls) == 3


@impls
def test_multiple_outputs_saved(impl):
    def fn(x, w):
        values, indices = torch.max(torch.mm(x, w), dim=1)
        m, v = torch.var_mean(x * w, dim=0)
        return values.sum() + m.sum() + v.sum() + indices.float().sum()

    def policy(ctx, op, *args, **kwargs):
        return op in (aten.max.dim, aten.var_mean.correction)

    run(impl, policy, fn=fn)


@impls
def test_non_tensor_outputs_saved(impl):
    """An op with a Python scalar output (item -> _local_scalar_dense) saved like a tensor one."""
    def fn(x, w):
        scale = (x * w).sum().item()
        return torch.sigmoid(torch.mm(x, w)) * scale

    run(impl, lambda ctx, op, *a, **k: CheckpointPolicy.MUST_SAVE, fn=fn)


@impls
def test_mutating_a_saved_output_after_the_region_is_an_error(impl):
    def fn(x, w):
        a = torch.mm(x, w)
        return a, a * a  # mul saves a: backward needs it from the recompute, served from the cache

    x, w = inputs()
    a, b = checkpoint(fn, x, w, use_reentrant=False, context_fn=functools.partial(IMPLS[impl], [aten.mm.default]))
    with torch.no_grad():
        a.add_(1)  # the saved mm output, written after the region, before backward
    with pytest.raises(RuntimeError, match="mutated"):
        b.sum().backward()


@impls
def test_mutation_allowed(impl):
    """allow_cache_entry_mutation=True: no error under either. torch then serves the written value (its documented
    trade: the check is off); hpac's cache took its own copy on the write, and its gradient is exact."""
    def fn(x, w):
        a = torch.mm(x, w)
        b = torch.sigmoid(a)
        a.mul_(2)  # in place, inside the region, into the saved mm output
        return a * b

    x, w = inputs()
    ref_out, ref_grads = grads(fn, x, w)
    out = checkpoint(fn, x, w, use_reentrant=False,
                     context_fn=functools.partial(IMPLS[impl], [aten.mm.default], True))
    out.sum().backward()
    if impl == "hpac":
        assert_same([x.grad, w.grad], ref_grads)


def test_write_inside_the_region_into_a_saved_output():
    """torch raises when the recompute finds the cached mm output mutated; hpac gives the cache its own copy on the
    first write inside the region (Note [Copy on write], replay/replay_storage.cpp) and the gradient is exact."""
    def fn(x, w):
        a = torch.mm(x, w)
        b = torch.sigmoid(a)
        a.mul_(2)
        return a * b

    x, w = inputs()
    ref_out, ref_grads = grads(fn, x, w)
    out = checkpoint(fn, x, w, use_reentrant=False,
                     context_fn=functools.partial(IMPLS["torch"], [aten.mm.default]))
    with pytest.raises(RuntimeError, match="mutated"):
        out.sum().backward()
    x.grad = w.grad = None
    out = checkpoint(fn, x, w, use_reentrant=False,
                     context_fn=functools.partial(IMPLS["hpac"], [aten.mm.default]))
    out.sum().backward()
    assert_same([x.grad, w.grad], ref_grads)


@impls
def test_backward_twice_is_an_error(impl):
    x, w = inputs()
    out = checkpoint(chain, x, w, use_reentrant=False, context_fn=functools.partial(IMPLS[impl], [aten.mm.default]))
    out.sum().backward(retain_graph=True)
    with pytest.raises(RuntimeError, match="extra time"):
        out.sum().backward()


@impls
def test_storage_released_after_backward(impl):
    hpac.track_memory()
    x, w = inputs(64)
    base = hpac.cpu_tensor_memory_stats()["current_bytes"]
    out = checkpoint(chain, x, w, use_reentrant=False,
                     context_fn=functools.partial(IMPLS[impl], lambda ctx, op, *a, **k: CheckpointPolicy.MUST_SAVE))
    kept = hpac.cpu_tensor_memory_stats()["current_bytes"] - base
    out.sum().backward()
    del out
    x.grad = w.grad = None
    assert kept > 6 * 64 * 64 * 4  # every op's output kept
    assert hpac.cpu_tensor_memory_stats()["current_bytes"] == base


def test_same_bytes_kept_as_torch():
    """The same policy keeps the same bytes after forward under both implementations."""
    hpac.track_memory()

    def policy(ctx, op, *args, **kwargs):
        return op in (aten.mm.default, aten.sigmoid.default)

    kept = {}
    for impl in ("torch", "hpac"):
        x, w = inputs(64)
        base = hpac.cpu_tensor_memory_stats()["current_bytes"]
        out = checkpoint(chain, x, w, use_reentrant=False, context_fn=functools.partial(IMPLS[impl], policy))
        kept[impl] = hpac.cpu_tensor_memory_stats()["current_bytes"] - base
        out.sum().backward()
        del out, x, w  # nothing of this run is freed inside the next one's measurement
    assert kept["hpac"] == kept["torch"] >= 4 * 64 * 64 * 4  # three mm outputs and the sigmoid at least


# ---- outer dispatch modes around backward ----------------------------------------------------------------------


@impls
def test_flop_counter_around_backward_counts_what_ran(impl):
    """Backward of three mms: 6 gradient mms; the recompute runs one mm of three under this policy. FlopCounterMode
    counts 7 mms' flops, as many with hpac as with torch (hpac once counted the served ones too)."""
    n = 16
    seen = {"mm": 0}

    def policy(ctx, op, *args, **kwargs):
        if op == aten.mm.default:
            seen["mm"] += 1
            return seen["mm"] != 2
        return False

    x, w = inputs(n)
    out = checkpoint(chain, x, w, use_reentrant=False, context_fn=functools.partial(IMPLS[impl], policy))
    with FlopCounterMode(display=False) as flops:
        out.sum().backward()
    assert flops.get_total_flops() == 7 * 2 * n ** 3


@impls
def test_flop_counter_with_hpac_builtin_selective(impl):
    """hpac's own policies too: under hpac.context_fn('selective') an outer counter sees only recomputed ops."""
    if impl == "torch":
        pytest.skip("hpac's built-in policy only")
    x, w = inputs(16)
    out = checkpoint(chain, x, w, use_reentrant=False, context_fn=hpac.context_fn("selective"))
    with FlopCounterMode(display=False) as flops:
        out.sum().backward()
    # selective: 1st and 3rd mm saved, the 2nd recomputed -> 6 backward mms + 1
    assert flops.get_total_flops() == 7 * 2 * 16 ** 3


def test_logging_mode_around_backward_sees_the_same_recompute():
    """A counting mode around backward sees the same ops run again under both (here: mul only; tanh's output is
    what backward reads, its input the saved mm)."""
    policy = [aten.mm.default, aten.sigmoid.default]
    counts = run("hpac", policy, count=True)
    assert counts == run("torch", policy, count=True)
    assert counts == {"mul": 1, "tanh": 1}


# ---- torch.compile ---------------------------------------------------------------------------------------------


@pytest.fixture
def dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def compiled_recompute_tags(impl, policy):
    """{op name: recompute tag} of the forward graph's nodes traced through impl's contexts (aot_eager)."""
    from torch._dynamo.backends.common import aot_autograd
    from torch._functorch.partitioners import min_cut_rematerialization_partition

    graphs = {}

    def fw(gm, example_inputs):
        graphs["forward"] = gm
        return torch._functorch.aot_autograd.make_boxed_func(gm.forward)

    def bw(gm, example_inputs):
        graphs["backward"] = gm
        return torch._functorch.aot_autograd.make_boxed_func(gm.forward)

    backend = aot_autograd(fw_compiler=fw, bw_compiler=bw, partition_fn=min_cut_rematerialization_partition)
    context_fn = functools.partial(IMPLS[impl], policy)

    def region(x, w):
        return checkpoint(chain, x, w, use_reentrant=False, context_fn=context_fn)

    x, w = inputs()
    ref_out, ref_grads = grads(chain, x, w)
    out = torch.compile(region, backend=backend, fullgraph=True)(x, w)
    out.sum().backward()
    assert_same([x.grad, w.grad], ref_grads)
    bw_mms = sum(1 for n in graphs["backward"].graph.nodes if n.target == aten.mm.default)
    return bw_mms


@impls
@pytest.mark.parametrize("rule", ["MUST_SAVE", "MUST_RECOMPUTE", "custom", "list"])
def test_compile_partial_context_fn(impl, rule, dynamo):
    """Under torch.compile the same partial works: MUST_SAVE keeps every mm (6 gradient mms in backward),
    MUST_RECOMPUTE forces all three again into backward (9), a custom rule the 2nd only (7)."""
    if rule == "list":
        policy, expected = [aten.mm.default], 6
    elif rule == "custom":
        state = {"mm": 0}

        def policy(ctx, op, *args, **kwargs):
            if op == aten.mm.default:
                state["mm"] += 1
                return CheckpointPolicy.MUST_RECOMPUTE if state["mm"] % 3 == 2 else CheckpointPolicy.MUST_SAVE
            return CheckpointPolicy.PREFER_RECOMPUTE
        expected = 7
    else:
        answer = getattr(CheckpointPolicy, rule)

        def policy(ctx, op, *args, **kwargs):
            return answer if op == aten.mm.default else CheckpointPolicy.PREFER_RECOMPUTE
        expected = 6 if rule == "MUST_SAVE" else 9
    assert compiled_recompute_tags(impl, policy) == expected


def test_context_fn_takes_a_policy_function():
    """hpac.context_fn accepts the same callables (with hpac's keywords: on_invocation)."""
    invocations = []

    def policy(ctx, op, *args, **kwargs):
        return op == aten.mm.default

    x, w = inputs()
    ref_out, ref_grads = grads(chain, x, w)
    out = checkpoint(chain, x, w, use_reentrant=False,
                     context_fn=hpac.context_fn(policy, on_invocation=invocations.append))
    out.sum().backward()
    assert_same([x.grad, w.grad], ref_grads)
    stats = invocations[0].stats()
    assert stats["saved"] == 3 and stats["served"] == 3


def test_decisions_replayed_in_cpp_not_asked_again():
    """A random policy, different in every call of the same region: each call's recompute replays its own forward's
    answers (never the policy again), gradients exact."""
    import random
    rng = random.Random(3)
    asked = {"n": 0}

    def policy(ctx, op, *args, **kwargs):
        asked["n"] += 1
        return rng.choice(list(CheckpointPolicy)[:4])

    for _ in range(4):
        before = asked["n"]
        x, w = inputs()
        ref_out, ref_grads = grads(chain, x, w)
        out = checkpoint(chain, x, w, use_reentrant=False,
                         context_fn=functools.partial(hpac.create_selective_checkpoint_contexts, policy))
        forward_asks = asked["n"] - before
        out.sum().backward()
        assert asked["n"] - before == forward_asks
        assert_same([x.grad, w.grad], ref_grads)


HAS_RESPECT = IMPLS and "respect_saved_tensors_hooks" in __import__("inspect").signature(checkpoint).parameters


@pytest.mark.skipif(not HAS_RESPECT, reason="checkpoint(respect_saved_tensors_hooks=) arrived in torch 2.14 (this is "
                    f"{torch.__version__})")
@pytest.mark.parametrize("respect", [True, False])
def test_respect_saved_tensors_hooks_means_what_it_means_for_torch(respect):
    """torch >= 2.14: checkpoint(..., respect_saved_tensors_hooks=True) routes what SAC keeps through the user's
    saved_tensors_hooks, False bypasses them. hpac's kept tensors follow the same argument (Note [torch's
    respect_saved_tensors_hooks], _regions.py): the hooks see as many tensors under both, gradients exact."""
    packed = {}
    for impl in ("torch", "hpac"):
        count = [0]

        def pack(t):
            count[0] += 1
            return t

        x, w = inputs()
        ref_out, ref_grads = grads(chain, x, w)
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            out = checkpoint(chain, x, w, use_reentrant=False, respect_saved_tensors_hooks=respect,
                             context_fn=functools.partial(IMPLS[impl], [aten.mm.default]))
        out.sum().backward()
        assert_same([x.grad, w.grad], ref_grads)
        packed[impl] = count[0]
    assert packed["hpac"] == packed["torch"]


def test_hpac_checkpoint_and_wrapper_take_a_policy_function():
    """hpac's own frame (hpac.checkpoint) and checkpoint_wrapper take the same policy functions: the stateful
    "every mm but the 2nd" policy recomputes one mm of three, gradients exact."""
    for how in ("checkpoint", "wrapper"):
        policy, _ = every_mm_but_the_second()

        class Chain(torch.nn.Module):
            def forward(self, x, w):
                return chain(x, w)

        x, w = inputs()
        out = chain(x, w)
        plain = OpCounter()
        with plain:
            out.sum().backward()
        ref = [x.grad.clone(), w.grad.clone()]
        x.grad = w.grad = None
        if how == "checkpoint":
            out = hpac.checkpoint(chain, x, w, policy=policy)
        else:
            out = hpac.checkpoint_wrapper(Chain(), policy=policy)(x, w)
        counter = OpCounter()
        with counter:
            out.sum().backward()
        assert_same([x.grad, w.grad], ref)
        assert counter.counts.get("mm", 0) - plain.counts.get("mm", 0) == 1, how


def test_policy_fn_with_mutation_allowed_keeps_private_copies():
    """A policy_fn's provisional entry answered save under allow_cache_entry_mutation=True becomes a clone
    (Invocation::makePrivate): a write after the region into the saved mm output does not reach what the recompute is
    served, gradients exact."""
    def fn(x, w):
        a = torch.mm(x, w)
        return a, a * a  # mul saves a: backward needs it from the recompute, served from the cache

    x, w = inputs()
    a, b = fn(x, w)
    b.sum().backward()
    ref_grads = [x.grad.clone(), w.grad.clone()]
    x.grad = w.grad = None
    policy = lambda ctx, op, *args, **kwargs: op == aten.mm.default  # noqa: E731
    a, b = checkpoint(fn, x, w, use_reentrant=False,
                      context_fn=functools.partial(hpac.create_selective_checkpoint_contexts, policy, True))
    with torch.no_grad():
        a.add_(1)
    b.sum().backward()
    assert_same([x.grad, w.grad], ref_grads)
