"""hpac's built-in selective policy against PyTorch's own selective activation checkpointing running the same policy
(hpac.harness.sac_reference), on a 2-layer MoE block stack with eager (bmm) and SDPA attention, each layer under
torch.utils.checkpoint.checkpoint(use_reentrant=False, context_fn=...):
  - the reference mirrors policy/op_tables.cpp entry for entry, and both save the same ops in the same order;
  - bytes kept after forward agree within 2% and are below no checkpointing; a deliberately different reference
    policy (every matmul saved) is more than 2% away, so the check can fail;
  - gradients of the input and every parameter are bitwise equal to each other and to no checkpointing.
"""
import os
import re

import pytest
import torch

import hpac
from hpac._loader import _major_minor
from hpac.harness.blocks import ATTENTION_KINDS, Block
from hpac.harness.parity import assert_same

pytestmark = pytest.mark.skipif(
    _major_minor(torch.__version__) < (2, 4),
    reason="PyTorch's selective checkpointing (create_selective_checkpoint_contexts with CheckpointPolicy) needs "
           f"torch >= 2.4 (this is torch {torch.__version__})")

if _major_minor(torch.__version__) >= (2, 4):
    import hpac.harness.sac_reference as sac_reference
    from hpac.harness.sac_reference import measure_step

OP_TABLES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "policy", "op_tables.cpp")
KEPT_TOLERANCE = 0.02
SEQ = 64

hpac.track_memory()  # once per process, before the tensors measured here exist


def op_table(name):
    """The op names of `constexpr OpEntry <name>[] = {...};` in policy/op_tables.cpp."""
    with open(OP_TABLES) as f:
        source = f.read()
    body = re.search(r"constexpr OpEntry " + name + r"\[\] = \{(.*?)\n\};", source, re.S)
    assert body, f"{name} not found in {OP_TABLES}"
    return set(re.findall(r'\{"([^"]+)", k(?:Required|Optional)\}', body.group(1)))


def test_reference_mirrors_op_tables():
    assert sac_reference.IGNORED_OPS == op_table("kIgnoredOps")
    assert sac_reference.RECOMPUTE_OPS == op_table("kRecomputeOps")
    assert sac_reference.MATMUL_OPS == op_table("kMatmulOps")
    assert sac_reference.SAVE_OPS == op_table("kSaveOps")


def make_stack(attention):
    # SDPA with dropout takes torch's math path (bmm) on CPU: dropout 0 keeps the fused CPU kernel under test.
    torch.manual_seed(0)
    dropout = 0.0 if attention == "sdpa" else 0.1
    return torch.nn.Sequential(*[Block(attention=attention, dropout=dropout) for _ in range(2)])


def make_input():
    torch.manual_seed(5)
    return torch.randn(2, SEQ, 32)


def recording_hpac_context_fn(log):
    """hpac.context_fn('selective') with the op log on: every invocation appends its Invocation to log."""
    def context_fn():
        inv = hpac.Invocation("selective", record_ops=True)
        log.append(inv)
        return inv.region("forward"), inv.region("recompute")
    return context_fn


@pytest.mark.parametrize("attention", ATTENTION_KINDS)
def test_both_save_the_same_ops_in_the_same_order(attention):
    model, x0 = make_stack(attention), make_input()
    invocations, decisions = [], []
    measure_step(model, x0, recording_hpac_context_fn(invocations))
    measure_step(model, x0, sac_reference.make_context_fn(log=decisions))
    hpac_saved = [line.split()[1] for inv in invocations for line in inv.op_log()
                  if line.startswith("forward ") and line.endswith(" saved")]
    reference_saved = [op for op, saved in decisions if saved]
    assert hpac_saved == reference_saved
    attention_op = "aten::_scaled_dot_product_flash_attention_for_cpu" if attention == "sdpa" else "aten::bmm"
    assert hpac_saved.count(attention_op) == (2 if attention == "sdpa" else 4)  # per layer: 1 kernel or 2 bmm


@pytest.mark.parametrize("attention", ATTENTION_KINDS)
def test_kept_bytes_agree_and_gradients_are_bitwise_equal(attention):
    model, x0 = make_stack(attention), make_input()
    off = measure_step(model, x0)
    invocations = []
    with_hpac = measure_step(model, x0, hpac.context_fn("selective", on_invocation=invocations.append))
    with_ref = measure_step(model, x0, sac_reference.make_context_fn())
    # Beside what both keep, hpac keeps a copy of each recomputed topk's indices for the recompute to be checked
    # against (Note [Routing is verified]); the reference has no such check.
    routing = sum(inv.stats()["routing_kept_bytes"] for inv in invocations)
    assert routing > 0
    kept_hpac, kept_ref = with_hpac.kept_bytes - routing, with_ref.kept_bytes
    assert abs(kept_hpac - kept_ref) <= KEPT_TOLERANCE * kept_ref, (kept_hpac, kept_ref)
    assert kept_hpac < off.kept_bytes and kept_ref < off.kept_bytes, (kept_hpac, kept_ref, off.kept_bytes)
    assert_same(with_hpac.grads, off.grads)
    assert_same(with_ref.grads, off.grads)


def test_kept_bytes_check_sees_a_different_policy():
    # A reference that saves every matmul (not every second) must be outside the tolerance: the check can fail.
    model, x0 = make_stack("eager"), make_input()
    kept_hpac = measure_step(model, x0, hpac.context_fn("selective")).kept_bytes
    every_mm = measure_step(model, x0, sac_reference.make_context_fn(matmul_period=1))
    assert abs(kept_hpac - every_mm.kept_bytes) > KEPT_TOLERANCE * every_mm.kept_bytes, (kept_hpac, every_mm.kept_bytes)
    assert_same(every_mm.grads, measure_step(model, x0).grads)
