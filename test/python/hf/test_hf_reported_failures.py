"""Router recompute drift on the real transformers MoE models, through hpac.hf.prepare as a user configures it: the
Qwen3-MoE (softmax -> topk -> renormalise in place) and DeepSeek-V3 (group-limited topk: topk of each group's top-2
sum, scatter_ into a group mask, topk again; a shared expert). The failures reported elsewhere: NeMo-Automodel
PR #2635 (row_id_map [18187,16] -> [18201,16]), torchtitan #1117 / PR #3146 (99 vs 98 rows), torchtitan #3336
(repeat_interleave 30364 vs 30365), NeMo-Automodel #3325 (a tie-heavy top-k changes the token count by one).

CPU kernels do not drift, so it is injected (test/python/drift.py): during backward only, every topk is handed other
scores. hpac's default (routing: verify) stops backward at the first topk that decided differently, naming it; with
routing: save the recompute is served the forward's decisions and the gradients are those of the run without
checkpointing, drift or not (Note [Routing is verified], replay/routing_check.h)."""
import os
import sys

import pytest
import torch
import transformers

import hpac.hf as hf
import hpac.harness.compare as hc
import hpac.harness.models as hm
import models

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from drift import DriftingRouter, topk_shapes  # noqa: E402
from hpac.harness.parity import assert_same  # noqa: E402

MODES = ["full", "selective", "budget:0.5"]
FAMILIES = ["qwen3_moe", "deepseek_v3"]
YAML = models.QWEN3_MOE_YAML.replace("num_layers: 4", "num_layers: 2")


def _config(mode, **keys):
    config = hc.mode_config(hf.parse_config(YAML % "off", "drift.yaml"), mode)
    config["activation_checkpoint"].update(keys)
    return config


def _model(family):
    if family == "qwen3_moe":
        return models.qwen3_moe(hf.parse_config(YAML % "off")["model"])
    cfg = transformers.DeepseekV3Config(
        vocab_size=256, hidden_size=64, intermediate_size=128, moe_intermediate_size=32, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=4, n_shared_experts=1, n_routed_experts=8, n_group=4,
        topk_group=2, num_experts_per_tok=2, routed_scaling_factor=2.5, kv_lora_rank=16, q_lora_rank=32,
        qk_rope_head_dim=8, v_head_dim=16, qk_nope_head_dim=16, first_k_dense_replace=0, max_position_embeddings=128)
    cfg._attn_implementation = "sdpa"
    return models.seeded(lambda: transformers.DeepseekV3ForCausalLM(cfg))


def _ids():
    return hm.token_batch(256, 2, 16, 1234, 0)


def _grads(model):
    return [p.grad for p in model.parameters()]


def _off_grads(family):
    model = _model(family)
    model(input_ids=_ids(), labels=_ids()).loss.backward()
    return _grads(model)


def _prepared(family, mode, **keys):
    model = _model(family)
    prep = hf.prepare(model, _config(mode, **keys), log=None)
    assert prep.layers_wrapped == 2, prep.route
    shapes = topk_shapes(lambda: model(input_ids=_ids()))
    return model, prep, shapes


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("family", FAMILIES)
def test_router_drift_stops_backward_naming_topk(family, mode):
    model, prep, shapes = _prepared(family, mode)
    loss = model(input_ids=_ids(), labels=_ids()).loss
    with pytest.raises(RuntimeError, match=r"hpac: aten::topk \(default overload\) occurrence 0 of invocation \d+ "
                                           r"routed differently in the recompute than in the forward: return 1 "
                                           r"\(\[32(, \d)+\] Long\) differs in \d+ of \d+ elements .*routing: save"):
        with DriftingRouter(shapes):
            loss.backward()


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("family", FAMILIES)
def test_routing_save_trains_exactly_through_the_drift(family, mode):
    model, prep, shapes = _prepared(family, mode, routing="save")
    loss = model(input_ids=_ids(), labels=_ids()).loss
    with DriftingRouter(shapes) as drift:
        loss.backward()
    # The recompute's topk calls are served, not run: they never reach the outer drifting mode (Note [Outer dispatch
    # modes see what ran], hpac/_policy_fn.py), so no kernel of theirs could route otherwise.
    assert drift.moved == 0
    assert_same(_grads(model), _off_grads(family), atol=0.0)
    stats = [layer.take_stats() for layer in prep.layers]
    assert all(s["routing_checked"] == 0 and s["invocations"] == 1 for s in stats), stats


@pytest.mark.parametrize("family", FAMILIES)
def test_without_drift_every_layers_routing_is_checked_and_exact(family):
    model, prep, _ = _prepared(family, "selective")
    model(input_ids=_ids(), labels=_ids()).loss.backward()
    assert_same(_grads(model), _off_grads(family), atol=0.0)
    stats = [layer.take_stats() for layer in prep.layers]
    assert all(s["routing_checked"] >= 1 for s in stats), stats


def test_routing_and_state_writes_keys_reach_python_as_the_parser_read_them():
    ac = hf.parse_config("activation_checkpoint: {mode: selective, routing: save, state_writes: skip}\n",
                         "r.yaml")["activation_checkpoint"]
    assert (ac["routing"], ac["state_writes"]) == ("save", "skip")
    ac = hf.parse_config("activation_checkpoint: {mode: full}\n")["activation_checkpoint"]
    assert (ac["routing"], ac["state_writes"]) == ("verify", "warn")
    with pytest.raises(RuntimeError, match=r"r\.yaml:1:51: activation_checkpoint\.routing: 'recompute' is not "
                                           r"allowed; allowed: verify, save"):
        hf.parse_config("activation_checkpoint: {mode: selective, routing: recompute}\n", "r.yaml")
    with pytest.raises(RuntimeError, match=r"activation_checkpoint\.state_writes: 'twice'.*allowed: warn, error, "
                                           r"skip"):
        hf.parse_config("activation_checkpoint: {mode: selective, state_writes: twice}\n", "r.yaml")
