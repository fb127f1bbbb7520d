"""hpac.torchtitan: torchtitan's activation checkpointing call shape run by hpac (plugin/python/hpac/torchtitan.py).

On a small MoE transformer whose blocks sit in `model.layers`, as torchtitan's models hold them:
- with torchtitan installed (a test dependency, tools/requirements-nodeps.txt), torchtitan 0.3.0's own
  `SelectiveAC(config).apply(model)` and `hpac.torchtitan.apply_ac(model, config)` with the same config object keep
  the same (op, occurrence) list per block and the same bytes after forward, and both give gradients bitwise equal
  to no checkpointing; torchtitan's FullAC / MemoryBudgetAC configs map to hpac's full and (eager) budget;
- without torchtitan, hpac's own Config does the same against torchtitan's rules ported in test_field_policies.py.
"""
import copy
from collections import defaultdict

import pytest
import torch
import torch.nn.functional as F

import hpac
from hpac._loader import _major_minor
from hpac.harness.parity import assert_same

pytestmark = pytest.mark.skipif(
    _major_minor(torch.__version__) < (2, 4),
    reason=f"torch's SAC with CheckpointPolicy needs torch >= 2.4 (this is {torch.__version__})")

if _major_minor(torch.__version__) >= (2, 4):
    import hpac.torchtitan as hpac_tt

H, E, K, LAYERS = 32, 4, 2, 2


class Block(torch.nn.Module):
    """Attention (q, k, v, o projections, SDPA) and a top-k MoE whose router is moe.router.gate, as torchtitan's."""

    def __init__(self):
        super().__init__()
        self.q, self.k, self.v, self.o = (torch.nn.Linear(H, H, bias=False) for _ in range(4))
        self.moe = torch.nn.Module()
        self.moe.router = torch.nn.Module()
        self.moe.router.gate = torch.nn.Linear(H, E, bias=False)
        self.moe.experts = torch.nn.ModuleList(torch.nn.Linear(H, H, bias=False) for _ in range(E))

    def forward(self, x):
        b, s, _ = x.shape
        q, k, v = (p(x).view(b, s, 4, H // 4).transpose(1, 2) for p in (self.q, self.k, self.v))
        h = x + self.o(F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(b, s, H))
        flat = h.reshape(-1, H)
        scores = torch.softmax(self.moe.router.gate(flat), dim=-1)
        weights, chosen = torch.topk(scores, K, dim=-1)
        weights = weights / weights.sum(-1, keepdim=True)
        out = torch.zeros_like(flat)
        for e, expert in enumerate(self.moe.experts):
            rows, slot = torch.where(chosen == e)
            out = out.index_add(0, rows, F.silu(expert(flat[rows])) * weights[rows, slot, None])
        return h + out.view(b, s, H)


class Model(torch.nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.layers = torch.nn.ModuleDict({str(i): Block() for i in range(LAYERS)})

    def forward(self, x):
        for block in self.layers.values():
            x = block(x)
        return x


def step(model):
    """(bytes the forward left allocated, gradients)."""
    import gc
    hpac.track_memory()
    x = torch.randn(2, 16, H, generator=torch.Generator().manual_seed(1))
    gc.collect()
    base = hpac.cpu_tensor_memory_stats()["current_bytes"]
    out = model(x)
    kept = hpac.cpu_tensor_memory_stats()["current_bytes"] - base
    out.square().mean().backward()
    return kept, [p.grad for p in model.parameters()]


def hpac_kept(monkeypatch):
    """Records what every hpac invocation the adapter makes saves: [(op, occurrence)] per block call."""
    made, real = [], hpac.context_fn

    def recording(policy, *args, **kwargs):
        def on_invocation(inv):
            made.append(inv)
        return real(policy, *args, record_ops=True, on_invocation=on_invocation, **kwargs)

    monkeypatch.setattr(hpac, "context_fn", recording)

    def kept():
        out = []
        for inv in made:
            calls, saved = defaultdict(int), []
            for line in inv.op_log():
                phase, op, action = line.split()
                if phase == "forward":
                    if action == "saved":
                        saved.append((op, calls[op]))
                    calls[op] += 1
            out.append(saved)
        return out, sum(inv.stats()["routing_kept_bytes"] for inv in made)
    return kept


OFF = None


def off_grads():
    global OFF
    if OFF is None:
        OFF = step(Model())[1]
    return OFF


def test_hpac_config_keeps_what_torchtitans_rules_keep(monkeypatch):
    from test_field_policies import recording, torchtitan_policy
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper

    # torch's SAC with torchtitan's rules (the port), wrapped as torchtitan wraps each block
    ref = Model()
    kept_t = []
    shapes = [(H, E)]
    for name, block in ref.layers.named_children():
        def context_fn():
            kept_t.append([])
            return torch.utils.checkpoint.create_selective_checkpoint_contexts(
                recording(torchtitan_policy(shapes), kept_t[-1]))
        ref.layers.register_module(name, checkpoint_wrapper(block, context_fn=context_fn, early_stop=False))
    bytes_t, grads_t = step(ref)

    kept = hpac_kept(monkeypatch)
    model = hpac_tt.apply_ac(Model(), hpac_tt.Config())
    assert hpac_tt.policy_for_block(hpac_tt.Config(), Block(), "layers.0") == hpac.PolicySpec("torchtitan", shapes)
    bytes_h, grads_h = step(model)
    kept_h, routing_bytes = kept()
    assert kept_h == kept_t and len(kept_h) == LAYERS
    assert ("aten::topk", 0) in kept_h[0]
    assert bytes_h - routing_bytes == bytes_t
    assert_same(grads_h, off_grads())
    assert_same(grads_t, off_grads())


@pytest.mark.parametrize("mode", ["selective", "full", "budget", "save_all_but"])
def test_every_mode_is_exact(mode):
    config = hpac_tt.Config(mode=mode, memory_budget=0.4,
                            policy_params=["aten::mm"] if mode == "save_all_but" else ())
    model = hpac_tt.apply_ac(Model(), config)
    for _ in range(2):  # budget: the first call of each block profiles, the second replays its plan
        for p in model.parameters():
            p.grad = None
        assert_same(step(model)[1], off_grads())


def test_bad_config_is_refused():
    with pytest.raises(RuntimeError, match="unknown policy kind 'sometimes'; allowed: "):
        hpac_tt.apply_ac(Model(), hpac_tt.Config(mode="sometimes"))
    with pytest.raises(TypeError, match="config must be hpac.torchtitan.Config"):
        hpac_tt.apply_ac(Model(), {"mode": "torchtitan"})


# ---- torchtitan's own code --------------------------------------------------------------------------------------

def _torchtitan():
    return pytest.importorskip(
        "torchtitan.distributed.activation_checkpoint",
        reason="torchtitan is not installed (tools/setup.sh installs it from tools/requirements-nodeps.txt)")


def test_same_as_torchtitans_selective_ac(monkeypatch):
    tt = _torchtitan()
    config = tt.SelectiveAC.Config()  # force_recompute_mm_shapes_by_fqns = ["moe.router.gate"]
    kept_t, real = [], tt.create_selective_checkpoint_contexts

    def recording_contexts(policy_fn, *args, **kwargs):
        from test_field_policies import recording
        kept_t.append([])
        return real(recording(policy_fn, kept_t[-1]), *args, **kwargs)

    monkeypatch.setattr(tt, "create_selective_checkpoint_contexts", recording_contexts)
    ref = Model()
    tt.SelectiveAC(config).apply(ref)
    bytes_t, grads_t = step(ref)

    kept = hpac_kept(monkeypatch)
    model = hpac_tt.apply_ac(Model(), config)  # torchtitan's own config object
    bytes_h, grads_h = step(model)
    kept_h, routing_bytes = kept()
    assert kept_h == kept_t and len(kept_h) == LAYERS
    # mm 0-3 q, k, v, o; 4 the router (forced: recomputed, not counted); 5-8 the experts: every second counted saved
    assert [n for op, n in kept_h[0] if op == "aten::mm"] == [0, 2, 5, 7]
    assert bytes_h - routing_bytes == bytes_t
    assert_same(grads_h, off_grads())
    assert_same(grads_t, off_grads())


def test_torchtitans_full_and_memory_budget_configs():
    tt = _torchtitan()
    assert hpac_tt.ActivationCheckpointing(tt.FullAC.Config()).config.mode == "full"
    budget = hpac_tt.ActivationCheckpointing(tt.MemoryBudgetAC.Config(memory_budget=0.3)).config
    assert (budget.mode, budget.memory_budget) == ("budget", 0.3)
    model = hpac_tt.apply_ac(Model(), tt.MemoryBudgetAC.Config(memory_budget=0.3))  # eager: no torch.compile
    for _ in range(2):
        for p in model.parameters():
            p.grad = None
        assert_same(step(model)[1], off_grads())
