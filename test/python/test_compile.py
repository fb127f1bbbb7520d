"""hpac under torch.compile (torch >= 2.4): the traced region's contexts are PyTorch's selective checkpoint modes
driven by hpac's C++ policy (Note [hpac under torch.compile], docs/design.md).

- what the policy sees under compile against eager (the op sequence; the decisions that set the kept set);
- the partitioned graph keeps exactly what the policy marks MUST_SAVE (hand-counted on a chain), the same set as
  the same rules written for PyTorch's own create_selective_checkpoint_contexts;
- compiled training (off / full / selective, through hpac.context_fn and through checkpoint_wrapper) against eager
  off, several AdamW steps, kept bytes ordered full < selective < off;
- one compile for several layers and steps, no graph break;
- bad input: a Budget, use_reentrant=True, compiled autograd.
The compiler is aot_eager (AOTAutograd with the min-cut partitioner that inductor uses, no code generation), so that
the tests compile in seconds; one test runs inductor itself.
"""
import functools

import pytest
import torch

import hpac
from hpac._loader import _major_minor
from hpac.harness.parity import assert_same

pytestmark = pytest.mark.skipif(
    _major_minor(torch.__version__) < (2, 4),
    reason=f"hpac's compiled path needs torch.compile's selective checkpointing (torch >= 2.4; this is "
           f"{torch.__version__})")

if _major_minor(torch.__version__) >= (2, 4):
    import torch._dynamo.testing
    from torch._dynamo.backends.common import aot_autograd
    from torch._functorch.partitioners import min_cut_rematerialization_partition
    from torch.utils.checkpoint import CheckpointPolicy, checkpoint, create_selective_checkpoint_contexts

    import hpac._compile as hpac_compile
    import hpac.harness.sac_reference as sac_reference

TOLERANCE = 1e-5  # fp32; aot_eager is bitwise here, inductor differs by reassociation (~1e-7)


@pytest.fixture(autouse=True)
def fresh_dynamo():
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    hpac_compile.TRACED.clear()
    hpac_compile.RECORD = True  # the tests read what the policy was asked (off by default)
    yield
    hpac_compile.RECORD = False
    torch._dynamo.reset()


class GraphCapture:
    """A torch.compile backend (AOTAutograd, min-cut partitioner) that keeps the partitioned graphs: the tensors
    the forward saves for backward are the backward graph's inputs other than parameters, inputs and tangents."""

    def __init__(self):
        self.forward = self.backward = None
        self.backend = aot_autograd(fw_compiler=self._fw, bw_compiler=self._bw,
                                    partition_fn=min_cut_rematerialization_partition)

    def _fw(self, gm, example_inputs):
        self.forward = gm
        return torch._functorch.aot_autograd.make_boxed_func(gm.forward)

    def _bw(self, gm, example_inputs):
        self.backward = gm
        return torch._functorch.aot_autograd.make_boxed_func(gm.forward)

    def saved(self):
        """{forward node name: (op name, recompute tag)} of the activations the backward reads."""
        nodes = {n.name: n for n in self.forward.graph.nodes}
        out = {}
        for p in self.backward.graph.nodes:
            if p.op != "placeholder" or p.name.startswith(("primals_", "tangents_")):
                continue
            n = nodes[p.name]
            out[p.name] = (str(n.target), n.meta.get("recompute"))
        return out


class Chain(torch.nn.Module):
    """tanh(relu(x @ w1ᵀ) @ w2ᵀ) @ w3ᵀ, then sigmoid: three matmuls (aten::mm each, bias-free 2-D Linear)."""

    def __init__(self):
        super().__init__()
        self.l1 = torch.nn.Linear(16, 32, bias=False)
        self.l2 = torch.nn.Linear(32, 32, bias=False)
        self.l3 = torch.nn.Linear(32, 16, bias=False)

    def forward(self, x):
        return self.l3(torch.tanh(self.l2(torch.relu(self.l1(x))))).sigmoid()


def _ctx(policy):
    return lambda fn, *a: checkpoint(fn, *a, use_reentrant=False, context_fn=hpac.context_fn(policy))


def test_partitioned_graph_saves_what_the_policy_marks():
    torch.manual_seed(0)
    chain = Chain()
    x = torch.randn(4, 16, requires_grad=True)
    saved = {}
    for policy in ("selective", "full", None):
        torch._dynamo.reset()
        capture = GraphCapture()
        f = (lambda t: chain(t)) if policy is None else functools.partial(_ctx(policy), chain)
        torch.compile(f, backend=capture.backend, fullgraph=True)(x).sum().backward()
        saved[policy] = capture.saved()
        if policy == "selective":
            # hpac's C++ policy, counted per traced region: 3 matmuls, 3 transposes, relu, tanh, sigmoid; 2 saved.
            assert hpac_compile.TRACED[-1].stats() == {"counted": 9, "ignored": 0, "saved": 2}
    # Hand-counted from the rules: matmuls 1 and 3 MUST_SAVE, the 2nd and every pointwise op MUST_RECOMPUTE, views
    # (aten::t) recomputed. The 2nd matmul and relu / tanh come back from mm (1st) in backward.
    sel = saved["selective"]
    assert sorted(op for op, _ in sel.values()) == ["aten.mm.default", "aten.mm.default"], sel
    assert all(tag == CheckpointPolicy.MUST_SAVE for _, tag in sel.values()), sel
    assert set(sel) == {"mm", "mm_2"}, sel
    assert saved["full"] == {}, saved["full"]  # everything from the inputs and parameters
    off_ops = sorted(op for op, _ in saved[None].values())
    assert len(off_ops) > len(sel) and "aten.relu.default" in off_ops, off_ops


def test_the_policy_sees_under_compile_what_it_sees_in_eager():
    """The op sequence hpac's policy is asked about, eagerly (the fallback's op log) and traced (TracedPolicy's log),
    on a dense block with dropout and an in-place op, SDPA attention and eager attention: the matmul family and
    save-table ops, with their decisions, are the same list; the rest differs only where docs/design.md says."""
    from hpac.harness.blocks import Attention

    class Dense(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.norm, self.up, self.down = torch.nn.LayerNorm(32), torch.nn.Linear(32, 64), torch.nn.Linear(64, 32)

        def forward(self, x):
            h = torch.nn.functional.gelu(self.up(self.norm(x)))
            h.mul_(2.0)  # in place: seen as aten::mul_ in both (the policy sits above functionalization)
            return x + torch.nn.functional.dropout(self.down(h), 0.1)

    torch.manual_seed(0)
    kept_kinds = {"matmul", "save"}
    for block in (Dense(), Attention(32, 4, 0.0, "sdpa"), Attention(32, 4, 0.1, "eager")):
        x = torch.randn(2, 8, 32, requires_grad=True)
        invs = []
        f = functools.partial(lambda blk, t: checkpoint(blk, t, use_reentrant=False, context_fn=hpac.context_fn(
            "selective", on_invocation=invs.append, record_ops=True)), block)
        f(x).sum().backward()
        eager = [line.split()[1:] for line in invs[-1].op_log() if line.startswith("forward ")]
        torch._dynamo.reset()
        hpac_compile.TRACED.clear()
        torch.compile(f, backend="aot_eager", fullgraph=True)(x).sum().backward()
        traced = [line.split() for line in hpac_compile.TRACED[-1].log()]

        def kept(rows, saved_word):
            return [(op, action == saved_word) for op, action in rows if _kind(op) in kept_kinds]
        assert kept(eager, "saved") == kept(traced, "MUST_SAVE"), type(block).__name__
        assert any(saved for _, saved in kept(eager, "saved"))

        # The rest: eager dropout on CPU arrives decomposed (empty_like, bernoulli_, div_, mul) where the traced
        # region sees aten::native_dropout; the view after a batched matmul is aten::_unsafe_view in eager and
        # aten::view (an ignored op) under compile. Nothing else differs.
        def normal(rows, ignored_word):
            out, i = [], 0
            names = [op for op, _ in rows]
            while i < len(names):
                if names[i:i + 4] == ["aten::empty_like", "aten::bernoulli_.float", "aten::div_.Scalar",
                                      "aten::mul.Tensor"]:
                    out.append("dropout")
                    i += 4
                    continue
                out.append({"aten::native_dropout": "dropout", "aten::_unsafe_view": "view",
                            "aten::view": "view"}.get(names[i], names[i]))
                i += 1
            return out
        assert normal(eager, "ignored") == normal(traced, "ignored"), type(block).__name__


def _kind(op_name):
    """sac_reference's category of an op named as hpac's logs name it ("aten::mm", "aten::max.dim")."""
    name, _, overload = op_name.partition(".")
    return sac_reference.category_of(name, overload or "default")


def test_same_kept_set_as_pytorch_sac_with_the_same_rules():
    """hpac's selective policy under compile against the same rules written as a policy_fn for PyTorch's own
    create_selective_checkpoint_contexts (sac_reference.SelectivePolicy, with hpac's MUST_RECOMPUTE for ops outside
    every table): the partitioned graph keeps the same tensors."""
    from hpac.harness.blocks import Attention

    def reference_context_fn():
        rules = sac_reference.SelectivePolicy()

        def policy_fn(ctx, op, *args, **kwargs):
            answer = rules(ctx, op, *args, **kwargs)
            return CheckpointPolicy.MUST_RECOMPUTE if sac_reference.category(op) == "other" else answer
        return create_selective_checkpoint_contexts(policy_fn)

    torch.manual_seed(0)
    for block in (Chain(), Attention(32, 4, 0.0, "sdpa")):
        x = torch.randn(2, 8, 16 if isinstance(block, Chain) else 32, requires_grad=True)
        kept = {}
        for name, cf in (("hpac", hpac.context_fn("selective")), ("torch", reference_context_fn)):
            torch._dynamo.reset()
            capture = GraphCapture()
            f = functools.partial(lambda blk, c, t: checkpoint(blk, t, use_reentrant=False, context_fn=c), block, cf)
            torch.compile(f, backend=capture.backend, fullgraph=True)(x).sum().backward()
            kept[name] = {k: op for k, (op, _) in capture.saved().items()}
        assert kept["hpac"] == kept["torch"] and kept["hpac"], kept


def _dense_and_moe_models():
    """A transformers Qwen3MoeForCausalLM (experts 'batched_mm': the eager experts loop breaks the graph on data-
    dependent shapes) and a dense Qwen3ForCausalLM, tiny, random weights."""
    transformers = pytest.importorskip("transformers")
    transformers.logging.set_verbosity_error()
    common = dict(vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, head_dim=8, max_position_embeddings=64, use_cache=False)
    moe = transformers.Qwen3MoeConfig(moe_intermediate_size=16, num_experts=4, num_experts_per_tok=2,
                                      norm_topk_prob=True, **common)
    moe._experts_implementation = "batched_mm"
    dense = transformers.Qwen3Config(**common)
    for cfg in (moe, dense):
        cfg._attn_implementation = "sdpa"
    return {"qwen3_moe": (transformers.Qwen3MoeForCausalLM, moe), "qwen3": (transformers.Qwen3ForCausalLM, dense)}


def _train(cls, cfg, mode, compiled, steps=3, how="context_fn"):
    """Losses, per-step gradients and the tensor bytes kept after each forward of `steps` AdamW steps; each decoder
    layer checkpointed under `mode` (None: not at all) through hpac.context_fn or checkpoint_wrapper, and, when
    compiled, each layer compiled after wrapping (layer.compile(), as hpac.hf does)."""
    torch.manual_seed(0)
    model = cls(cfg)
    model.train()
    backend = torch._dynamo.testing.CompileCounterWithBackend("aot_eager")
    for layer in model.model.layers:
        if mode is not None and how == "context_fn":
            layer.forward = functools.partial(
                lambda f, c, *a, **k: checkpoint(f, *a, use_reentrant=False, context_fn=c, **k),
                layer.forward, hpac.context_fn(mode))
        elif mode is not None:
            hpac.checkpoint_wrapper(layer, mode)
        if compiled:
            layer.compile(backend=backend)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    g = torch.Generator().manual_seed(1)
    losses, grads, kept = [], [], []
    for _ in range(steps):
        ids = torch.randint(0, cfg.vocab_size, (2, 16), generator=g)
        opt.zero_grad(set_to_none=True)
        before = hpac.cpu_tensor_memory_stats()["current_bytes"]
        loss = model(input_ids=ids, labels=ids).loss
        kept.append(hpac.cpu_tensor_memory_stats()["current_bytes"] - before)
        loss.backward()
        losses.append(loss.detach())
        grads.append([p.grad.clone() for p in model.parameters()])
        opt.step()
    return losses, grads, kept, backend.frame_count


@pytest.mark.parametrize("family", ["qwen3_moe", "qwen3"])
def test_compiled_training_matches_eager_off(family):
    cls, cfg = _dense_and_moe_models()[family]
    hpac.track_memory()
    ref_losses, ref_grads, _, _ = _train(cls, cfg, None, compiled=False)
    kept = {}
    for mode, how in ((None, "context_fn"), ("full", "context_fn"), ("selective", "context_fn"),
                      ("selective", "checkpoint_wrapper")):
        torch._dynamo.reset()
        torch._dynamo.utils.counters.clear()
        losses, grads, kept_bytes, frames = _train(cls, cfg, mode, compiled=True, how=how)
        for step, (got, ref) in enumerate(zip(grads, ref_grads)):
            assert_same([losses[step]], [ref_losses[step]], atol=TOLERANCE)
            assert_same(got, ref, atol=TOLERANCE)
        # One graph for both layers and every step; nothing broke the layer's graph.
        assert frames == 1, (mode, how, frames)
        assert not torch._dynamo.utils.counters["graph_break"], dict(torch._dynamo.utils.counters["graph_break"])
        kept[mode] = kept_bytes[-1]
    assert kept["full"] < kept["selective"] < kept[None], kept
    assert hpac_compile.TRACED, "hpac's policy was never asked"


def test_inductor_keeps_what_the_policy_marks():
    """The real compiler once (C++ code generation on CPU): parity with eager off and the selective kept set."""
    torch.manual_seed(0)
    chain = Chain()
    x = torch.randn(4, 16, requires_grad=True)
    chain(x).sum().backward()
    ref = [x.grad] + [p.grad for p in chain.parameters()]
    x.grad = None
    chain.zero_grad(set_to_none=True)
    f = torch.compile(functools.partial(_ctx("selective"), chain), backend="inductor", fullgraph=True)
    f(x).sum().backward()
    assert_same([x.grad] + [p.grad for p in chain.parameters()], ref, atol=TOLERANCE)
    assert hpac_compile.TRACED and hpac_compile.TRACED[-1].stats()["saved"] == 2


def test_budget_under_compile_is_one_clear_error():
    torch.manual_seed(0)
    chain = Chain()
    x = torch.randn(4, 16, requires_grad=True)
    budget = hpac.budget(0.5)
    for f in (lambda t: checkpoint(chain, t, use_reentrant=False, context_fn=hpac.context_fn(budget)),
              lambda t: hpac.checkpoint(chain, t, policy=budget)):
        torch._dynamo.reset()
        with pytest.raises(Exception, match="activation_memory_budget") as info:
            torch.compile(f, backend="aot_eager")(x).sum().backward()
        assert "hpac: a memory budget (hpac.budget) cannot decide a region that torch.compile traces" in str(info.value)
    assert budget.stage == "profiling"  # never ran eagerly behind the error


def test_reentrant_with_context_fn():
    """Eagerly torch refuses it; under compile torch's checkpoint becomes non-reentrant and hpac's policy decides."""
    torch.manual_seed(0)
    chain = Chain()
    x = torch.randn(4, 16, requires_grad=True)
    f = lambda t: checkpoint(chain, t, use_reentrant=True, context_fn=hpac.context_fn("selective"))  # noqa: E731
    with pytest.raises(ValueError, match="use_reentrant=False"):
        f(x)
    capture = GraphCapture()
    torch.compile(f, backend=capture.backend, fullgraph=True)(x).sum().backward()
    assert set(capture.saved()) == {"mm", "mm_2"}


def test_compiled_autograd():
    """Compiled autograd over an eager forward: hpac's context_fn path gives the right gradients (the recompute is
    served from hpac's storage); hpac.checkpoint's own frame cannot be traced by it and says what to use."""
    torch.manual_seed(0)
    chain = Chain()
    x = torch.randn(4, 16, requires_grad=True)

    def grads(f):
        chain.zero_grad(set_to_none=True)
        x.grad = None
        f(x).sum().backward()
        return [x.grad] + [p.grad for p in chain.parameters()]

    ref = grads(chain)
    compiler = torch.compile(backend="aot_eager")
    for step in range(3):
        hpac.reset_global_stats()
        with torch._dynamo.compiled_autograd._enable(compiler):
            got = grads(lambda t: checkpoint(chain, t, use_reentrant=False, context_fn=hpac.context_fn("selective")))
        assert_same(got, ref)
    with torch._dynamo.compiled_autograd._enable(compiler):
        with pytest.raises(RuntimeError, match="compiled autograd.*hpac.context_fn"):
            grads(lambda t: hpac.checkpoint(chain, t, policy="selective"))


def test_moe_block_with_a_data_dependent_expert_loop():
    """hpac.harness.blocks loops over the experts a batch hits (torch.where, a branch on token.numel()):
    Dynamo cannot trace that loop into the checkpointed region, breaks the graph and runs the region eagerly, where
    hpac's own fallback serves it (counted in global_stats). Right gradients either way, never silently different."""
    from hpac.harness.blocks import Block
    torch.manual_seed(0)
    block = Block(dropout=0.0, attention="sdpa")
    x = torch.randn(2, 8, 32, requires_grad=True)

    def grads(f):
        block.zero_grad(set_to_none=True)
        x.grad = None
        f(x).pow(2).mean().backward()
        return [x.grad] + [p.grad for p in block.parameters()]

    ref = grads(block)
    hpac.reset_global_stats()
    got = grads(torch.compile(functools.partial(_ctx("selective"), block), backend="aot_eager"))
    assert_same(got, ref, atol=TOLERANCE)
    assert torch._dynamo.utils.counters["graph_break"], "the expert loop was expected to break the graph"
    assert hpac.global_stats()["served"] > 0  # the region ran eagerly through hpac's fallback


def test_dynamic_shapes_one_graph_and_exact():
    """torch.compile(dynamic=True) over an hpac region (pytorch#166926 reported "A different number of tensors was
    saved" when a dynamic-shape recompute took another graph): four sequence lengths, one graph, gradients exact."""
    from hpac.harness.blocks import Attention
    torch.manual_seed(0)
    attention = Attention(32, 4, 0.0, "sdpa")
    f = torch.compile(functools.partial(_ctx("selective"), attention), backend="aot_eager", dynamic=True)
    for seq in (8, 12, 16, 20):
        x = torch.randn(2, seq, 32, requires_grad=True)
        attention.zero_grad(set_to_none=True)
        f(x).sum().backward()
        got = [p.grad.clone() for p in attention.parameters()]
        attention.zero_grad(set_to_none=True)
        attention(x).sum().backward()
        assert_same(got, [p.grad for p in attention.parameters()])
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] == 1
    assert hpac_compile.TRACED and not torch._dynamo.utils.counters["graph_break"]
