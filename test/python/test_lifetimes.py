"""Lifetimes: nothing hpac holds outlives its graph, its model or its step (Note [Nothing outlives its model],
plugin/python/hpac/_regions.py; docs/reliability.md, "Memory across a run").

For every Python entry point and policy: N forwards whose graphs are dropped without backward, N steps that end in an
exception (inside the region's forward, inside the recompute, inside a policy function, inside an outer saved-tensor
hook), and N models wrapped, trained and dropped. After each, with gc.collect(): live CPU tensor bytes (hpac's
tracking allocator) exactly where they were, no hpac.Invocation alive, the model and its Budgets collected (their
weak references die), and the next step bitwise equal to the same step without checkpointing.
"""
import copy
import functools
import gc
import inspect
import os
import subprocess
import sys
import weakref

import pytest
import torch
import torch.utils.checkpoint

import hpac
from hpac._loader import _major_minor
from hpac.harness.blocks import Block
from hpac.harness.parity import assert_same

pytestmark = pytest.mark.usefixtures("only_new_objects_scanned")  # conftest.py

N = 4
HIDDEN, SEQ = 32, 8
HAS_CONTEXT_FN = "context_fn" in inspect.signature(torch.utils.checkpoint.checkpoint).parameters  # torch >= 2.1
HAS_POLICY_FN = hasattr(torch.utils.checkpoint, "CheckpointPolicy")
# libtorch's autograd engine can keep a failed backward's pending node tasks (and their input gradients) in the
# thread's ready queue until the next backward drains them, with or without hpac (Faults.OutOfMemoryDuringThe
# RecomputeReachesTheCallerOfBackward, docs/reliability.md): seen on 1.13 in every run, on 2.13 in some (tens of KB
# after the first failed recompute of a budget region). So after an exception in backward the bytes are compared
# after the next step; after one in the forward, at once as well.


class Fault(Exception):
    """What the tests raise; anything else is a failure of hpac."""


class FaultyBlock(Block):
    """A Qwen3-MoE-style block that calls `fault(phase)` between attention and MoE: phase 'forward' on the first run of
    a step, 'recompute' on the second (the checkpoint's recompute, which must run past attention: the MoE's saved
    tensors are needed)."""

    def __init__(self):
        super().__init__(hidden=HIDDEN, dropout=0.1)
        self.fault = None
        self.runs = 0

    def forward(self, x):
        self.runs += 1
        x = x + self.self_attn(self.input_layernorm(x))
        if self.fault is not None:
            self.fault("forward" if self.runs == 1 else "recompute")
        return x + self.mlp(self.post_attention_layernorm(x))


class Stack(torch.nn.Module):
    def __init__(self, seed=0):
        super().__init__()
        torch.manual_seed(seed)
        self.blocks = torch.nn.ModuleList(FaultyBlock() for _ in range(2))
        self.call = None  # call(block, x): the entry point under test; None: no checkpoint

    def forward(self, x):
        for b in self.blocks:
            b.runs = 0
            x = self.call(b, x) if self.call is not None else b(x)
        return x


def _every_mm(ctx, op, *args, **kwargs):
    return torch.utils.checkpoint.CheckpointPolicy.MUST_SAVE if op == torch.ops.aten.mm.default else \
        torch.utils.checkpoint.CheckpointPolicy.PREFER_RECOMPUTE


def _torch_checkpoint(context_fn):
    return lambda b, x: torch.utils.checkpoint.checkpoint(b, x, use_reentrant=False, context_fn=context_fn)


def _per_block(make):
    """An entry point that needs one object per region (a Budget, a context_fn of a Budget): made per block on
    first use, kept on the block (so the model owns it)."""
    def call(b, x):
        if "_lifetime_call" not in b.__dict__:
            b.__dict__["_lifetime_call"] = make()
        return b.__dict__["_lifetime_call"](b, x)
    return call


def _wrapped(mode_factory):
    def wrap(b, x):
        if not hpac._wrap.is_wrapped(b):
            hpac.checkpoint_wrapper(b, policy=mode_factory())
        return b(x)
    return wrap


# entry point -> a factory of call(block, x); every one is used as Stack.call
ENTRIES = {
    "checkpoint:selective": lambda: functools.partial(hpac.checkpoint, policy="selective"),
    "checkpoint:full": lambda: functools.partial(hpac.checkpoint, policy="full"),
    "checkpoint:save_list": lambda: functools.partial(hpac.checkpoint, policy=["aten::mm"]),
    "checkpoint:budget": lambda: _per_block(lambda: functools.partial(hpac.checkpoint, policy=hpac.budget(0.5))),
    "checkpoint_wrapper:selective": lambda: _wrapped(lambda: "selective"),
    "checkpoint_wrapper:budget": lambda: _wrapped(lambda: hpac.budget(0.5)),
}
if HAS_CONTEXT_FN:
    ENTRIES.update({
        "context_fn:selective": lambda: _torch_checkpoint(hpac.context_fn("selective")),
        "context_fn:full": lambda: _torch_checkpoint(hpac.context_fn("full")),
        "context_fn:budget": lambda: _per_block(lambda: _torch_checkpoint(hpac.context_fn(hpac.budget(0.5)))),
        "context_fn:hooked": lambda: _torch_checkpoint(hpac.context_fn("selective", on_invocation=lambda inv: None)),
        "context_fn:tally": lambda: _per_block(lambda: _torch_checkpoint(
            hpac.context_fn("selective", on_invocation=hpac.InvocationTally().watch))),
    })
if HAS_POLICY_FN:
    ENTRIES.update({
        "sac:list": lambda: _torch_checkpoint(functools.partial(hpac.create_selective_checkpoint_contexts,
                                                                [torch.ops.aten.mm.default])),
        "sac:policy_fn": lambda: _torch_checkpoint(functools.partial(hpac.create_selective_checkpoint_contexts,
                                                                     _every_mm)),
        "checkpoint:policy_fn": lambda: functools.partial(hpac.checkpoint, policy=_every_mm),
    })


def _live_bytes():
    gc.collect()
    return hpac.cpu_tensor_memory_stats()["current_bytes"]


def _live_invocations():
    """hpac.Invocation objects alive in Python and hpac::Invocation objects alive in C++ (a Budget's region keeps
    none of its calls)."""
    gc.collect()
    return sum(1 for o in gc.get_objects() if type(o) is hpac.Invocation), torch.ops.hpac.invocations_alive()


def _batch(step):
    g = torch.Generator().manual_seed(100 + step)
    return torch.randn(2, SEQ, HIDDEN, generator=g)


def _step(model, step):
    """One training step's loss and gradients (the step's seed fixes dropout)."""
    torch.manual_seed(step)
    loss = model(_batch(step)).square().mean()
    loss.backward()
    grads = [p.grad.clone() for p in model.parameters()]
    model.zero_grad(set_to_none=True)
    return [loss.detach()] + grads


def _model(entry):
    model = Stack()
    reference = copy.deepcopy(model)
    model.call = ENTRIES[entry]()
    return model, reference


@pytest.fixture(autouse=True)
def tracked():
    hpac.track_memory()
    yield


@pytest.mark.parametrize("entry", sorted(ENTRIES))
def test_dropped_forwards_free_what_they_saved(entry):
    model, _ = _model(entry)
    _step(model, 0)  # a Budget profiles and plans here
    baseline = _live_bytes()
    for i in range(N):
        out = model(_batch(i))  # evaluation in train mode, a skipped micro-batch: the graph is dropped
        del out
        assert _live_bytes() == baseline, f"{entry}: forward {i + 1} left {_live_bytes() - baseline} bytes"
    assert _live_invocations() == (0, 0)
    _step(model, 1)
    assert _live_bytes() == baseline


def _faults(entry):
    kinds = ["forward", "recompute", "outer_hook"]
    if "policy_fn" in entry:
        kinds.append("policy_fn")
    return kinds


@pytest.mark.parametrize("entry,kind", [(e, k) for e in sorted(ENTRIES) for k in _faults(e)])
def test_an_exception_anywhere_leaves_nothing_behind(entry, kind):
    model, reference = _model(entry)
    _step(model, 0)
    _step(reference, 0)
    packs = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: packs.append(1) or t, lambda t: t):
        _step(model, 0)
    model.packs_per_step = len(packs)
    baseline = _live_bytes()
    for i in range(N):
        with pytest.raises(Exception) as raised:
            _failing_step(model, kind, i)
        assert isinstance(raised.value, Fault) or "Fault" in str(raised.value), (entry, kind, raised.value)
        model.zero_grad(set_to_none=True)
        del raised
        if kind == "forward":
            assert _live_bytes() == baseline, f"{entry}, {kind} {i + 1}: {_live_bytes() - baseline} bytes left"
        _step(model, 50 + i)  # the next step drains what libtorch 1.x's engine kept of the failed backward
        assert _live_bytes() == baseline, f"{entry}, {kind} {i + 1}: {_live_bytes() - baseline} bytes after a step"
    assert _live_invocations() == (0, 0)
    assert_same(_step(model, 7), _step(reference, 7))  # the next step is bitwise the same as without checkpointing
    assert _live_bytes() == baseline


def _failing_step(model, kind, i):
    torch.manual_seed(i)
    x = _batch(i)
    if kind in ("forward", "recompute"):
        def fault(phase):
            if phase == kind:
                raise Fault(f"raised in the {phase}")
        model.blocks[1].fault = fault
        try:
            model(x).square().mean().backward()
        finally:
            model.blocks[1].fault = None
    elif kind == "outer_hook":  # the hook raises at its (1 + i)-th pack of N spread over a step's packs
        packed = []

        def pack(t):
            packed.append(1)
            if len(packed) == 1 + i * (model.packs_per_step - 1) // (N - 1):
                raise Fault("raised by an outer saved-tensor hook")
            return t
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            model(x).square().mean().backward()
    else:  # policy_fn: the policy function raises on the third mm of the second block
        seen = []
        policy = _every_mm

        def raising(ctx, op, *args, **kwargs):
            if op == torch.ops.aten.mm.default:
                seen.append(1)
                if len(seen) == 3:
                    raise Fault("raised by the policy function")
            return policy(ctx, op, *args, **kwargs)
        saved_call = model.call
        model.call = _torch_checkpoint(functools.partial(hpac.create_selective_checkpoint_contexts, raising)) \
            if entry_uses_torch(saved_call) else functools.partial(hpac.checkpoint, policy=raising)
        try:
            model(x).square().mean().backward()
        finally:
            model.call = saved_call


def entry_uses_torch(call):
    return getattr(call, "func", None) is not hpac.checkpoint


@pytest.mark.parametrize("entry", sorted(ENTRIES))
def test_a_dropped_model_is_collected(entry):
    baseline = _live_bytes()
    invocations = _live_invocations()
    registries = len(hpac._regions._CONTEXT_FNS), len(hpac.Budget._live)
    for _ in range(N):
        model, reference = _model(entry)
        _step(model, 0)
        _step(model, 1)
        out = model(_batch(2))  # a graph alive when the model goes: freed with it
        watched = [weakref.ref(model), weakref.ref(model.blocks[0]), weakref.ref(next(model.parameters()))]
        budgets = [weakref.ref(o) for o in gc.get_objects() if type(o) is hpac.Budget]
        del model, reference, out
        gc.collect()
        assert all(w() is None for w in watched), f"{entry}: the model outlived its last reference"
        assert all(w() is None for w in budgets), f"{entry}: a Budget outlived its model"
        assert _live_bytes() == baseline, f"{entry}: {_live_bytes() - baseline} bytes outlived the model"
    assert _live_invocations() == invocations
    assert (len(hpac._regions._CONTEXT_FNS), len(hpac.Budget._live)) == registries


def test_a_tally_counts_each_call_once_and_holds_no_invocation():
    tally = hpac.InvocationTally()
    block = FaultyBlock()
    x = torch.randn(2, SEQ, HIDDEN, requires_grad=True)
    ctx = hpac.context_fn("selective", on_invocation=tally.watch, record_ops=True) if HAS_CONTEXT_FN else None
    if ctx is None:
        pytest.skip("torch.utils.checkpoint has no context_fn before torch 2.1")
    per_call = []
    for _ in range(3):
        inv = []
        out = torch.utils.checkpoint.checkpoint(block, x, use_reentrant=False,
                                                context_fn=hpac.context_fn("selective", on_invocation=inv.append))
        out.sum().backward()
        per_call.append(inv[0].stats())
        del inv, out
    for _ in range(3):
        block.runs = 0
        torch.utils.checkpoint.checkpoint(block, x, use_reentrant=False, context_fn=ctx).sum().backward()
    assert tally.live == 0  # every graph is gone: nothing held
    total = tally.take()
    assert total["invocations"] == 3
    for key in ("saved", "served", "recomputed", "ops_forward", "ops_recompute"):
        assert total[key] == sum(s[key] for s in per_call), key
    assert sum(v for k, v in total.items() if k.startswith("log:forward")) == total["ops_forward"] + \
        sum(v for k, v in total.items() if k.startswith("log:forward") and k.endswith(" ignored"))
    assert tally.take() == {"invocations": 0}
    # A graph alive at take(): its progress so far now, the rest (the recompute) with the next take, never twice.
    out = torch.utils.checkpoint.checkpoint(block, x, use_reentrant=False, context_fn=ctx)
    first = tally.take()
    assert tally.live == 1 and first["ops_forward"] == per_call[0]["ops_forward"] and first.get("served", 0) == 0
    out.sum().backward()
    del out
    second = tally.take()
    assert tally.live == 0 and second["invocations"] == 0 and second.get("ops_forward", 0) == 0
    assert second["served"] == per_call[0]["served"]


def test_explain_removes_the_tracking_allocator_it_installed():
    """In a fresh process (this one installed it for good): explain draws with the tracker, then removes it."""
    code = ("import sys, torch, hpac\n"
            "from hpac.harness.blocks import Block\n"
            "assert not hpac.memory_tracked()\n"
            "e = hpac.explain(Block(hidden=32), torch.randn(2, 8, 32, requires_grad=True), policy='selective')\n"
            "assert e.data['timeline'] and max(t['peak_bytes'] for t in e.data['timeline']) > 0, e.data.keys()\n"
            "assert not hpac.memory_tracked(), 'explain left the tracking allocator installed'\n"
            "hpac.track_memory()\n"
            "assert hpac.memory_tracked()\n"
            "hpac.explain(Block(hidden=32), torch.randn(2, 8, 32, requires_grad=True), policy='selective')\n"
            "assert hpac.memory_tracked(), 'explain removed the tracker track_memory() installed for good'\n")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]


@pytest.mark.skipif(not HAS_POLICY_FN, reason="policy functions need torch.utils.checkpoint.CheckpointPolicy")
def test_operator_handles_follow_registration():
    """The C API's operator handles (cached per OpOverload by the policy_fn path) follow deregistration and
    re-registration of an op in place (Note [Operator handles follow registration], plugin/c_api.cpp)."""
    api = hpac._policy_fn._library()

    def define(schema, impl):
        lib = torch.library.Library("hpac_lifetime", "DEF")
        lib.define(schema)
        lib.impl("scale", impl, "CPU")
        return lib

    def saved_in_region(call):
        policy = lambda ctx, op, *a, **k: (torch.utils.checkpoint.CheckpointPolicy.MUST_SAVE
                                           if op.name().startswith("hpac_lifetime::") else
                                           torch.utils.checkpoint.CheckpointPolicy.PREFER_RECOMPUTE)
        invocations = []
        w = torch.ones(4, requires_grad=True)
        x = torch.arange(4.0)
        torch.utils.checkpoint.checkpoint(lambda w: (call(x) * w).sum(), w, use_reentrant=False,
                                          context_fn=hpac.context_fn(policy, on_invocation=invocations.append)
                                          ).backward()
        return invocations[0].stats()["saved"], w.grad

    lib = define("scale(Tensor x) -> Tensor", lambda x: x * 2)
    first = api.operator(torch.ops.hpac_lifetime.scale.default)
    saved, grad = saved_in_region(lambda x: torch.ops.hpac_lifetime.scale(x))
    assert first is not None and saved == 1 and torch.equal(grad, torch.arange(4.0) * 2)
    generation = api._generation()
    lib._destroy()
    del lib
    assert api._generation() != generation
    assert api._operator(b"hpac_lifetime::scale", b"") is None  # deregistered: no handle, never a stale one
    lib = define("scale(Tensor x, float f) -> Tensor", lambda x, f: x * f)
    again = api.operator(torch.ops.hpac_lifetime.scale.default)
    assert again == first  # the same address, refreshed in place: nothing cached by it can dangle
    saved, grad = saved_in_region(lambda x: torch.ops.hpac_lifetime.scale(x, 3.0))
    assert saved == 1 and torch.equal(grad, torch.arange(4.0) * 3)
    lib._destroy()


@pytest.mark.skipif(_major_minor(torch.__version__) < (2, 4), reason="hpac.torchtitan needs torch >= 2.4")
@pytest.mark.parametrize("mode", ["torchtitan", "full", "budget"])
def test_torchtitan_adapter_holds_nothing_after_its_graphs_and_model(mode):
    import hpac.torchtitan as hpac_tt
    from test_torchtitan_adapter import H, Model
    x = torch.randn(2, 16, H)
    config = hpac_tt.Config(mode=mode)
    baseline = _live_bytes()
    for _ in range(2):
        model = hpac_tt.apply_ac(Model(), config)
        model(x).square().mean().backward()  # a budget profiles and plans
        model.zero_grad(set_to_none=True)
        after_step = _live_bytes()
        for i in range(N):
            out = model(x)
            del out
            assert _live_bytes() == after_step, f"{mode}: dropped forward {i + 1}"
        assert _live_invocations() == (0, 0)
        watched = weakref.ref(model)
        del model
        gc.collect()
        assert watched() is None and _live_bytes() == baseline, f"{mode}: the model outlived its last reference"
