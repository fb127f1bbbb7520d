"""hpac.hf routing on real transformers models: one test per branch of the full-mode decision order (Note [Full
decision order], tools/trainer/route_plan.cpp), selective, off, KV sharing, use_cache, state_dict keys, and the
config errors that come from the C++ parser with file:line:col."""
import pytest
import torch

import hpac.hf as hf
import models


def cfg(mode, extra=""):
    return hf.parse_config(f"train: {{seq_len: 16}}\nactivation_checkpoint:\n  mode: {mode}\n{extra}", "test.yaml")


def prepare(model, mode, extra="", **kw):
    config = cfg(mode, extra)
    config["train"].update(kw)
    return hf.prepare(model, config, log=None)


def test_off_touches_nothing():
    m = models.llama()
    forward_before = {n: x.forward for n, x in m.named_modules()}
    prep = prepare(m, "off")
    assert not prep.touched and prep.layers == []
    assert m.config.use_cache is True
    assert all("forward" not in x.__dict__ for x in m.modules())
    assert {n: x.forward for n, x in m.named_modules()}.keys() == forward_before.keys()
    assert not m.is_activation_checkpointing


def test_full_native_on_a_language_only_model():
    m = models.llama()
    prep = prepare(m, "full")
    assert prep.full_route == "native", prep.full_route_reason
    assert prep.layers_wrapped == 3 and prep.submodules_wrapped == 0
    assert all(layer.gradient_checkpointing for layer in m.model.layers)
    assert m.config.use_cache is False
    assert any(msg.startswith("full: native path") for msg in prep.messages)


def test_full_compile_wraps_attention_and_mlp_only():
    m = models.llama()
    prep = prepare(m, "full", compile=True)
    assert prep.full_route == "compile"
    assert [p.submodules for p in prep.layers] == [["self_attn", "mlp"]] * 3
    assert prep.submodules_wrapped == 6 and prep.layers_wrapped == 0


def test_full_two_towers_take_submodules_first_even_with_compile():
    for compile_on in (False, True):
        m = models.llava()
        prep = prepare(m, "full", compile=compile_on)
        assert prep.full_route == "submodules", (compile_on, prep.full_route_reason)
        assert "not language-tower-only" in prep.full_route_reason
        subs = {p.role: p.submodules for p in prep.layers}
        assert subs["language"] == ["mlp", "self_attn", "input_layernorm", "post_attention_layernorm"]
        assert subs["vision"] == ["mlp", "self_attn", "layer_norm1", "layer_norm2"]
        assert prep.submodules_wrapped == 16
        assert prep.use_cache_disabled == ["config", "config.text_config", "config.vision_config"]
        assert m.config.text_config.use_cache is False


def test_full_frozen_layer_is_not_native():
    m = models.llama()
    for p in m.model.layers[1].parameters():
        p.requires_grad_(False)
    prep = prepare(m, "full")
    assert prep.full_route == "submodules" and "frozen" in prep.full_route_reason
    assert prep.layers[0].submodules == ["mlp", "self_attn", "input_layernorm", "post_attention_layernorm"]


class Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.mixer = torch.nn.Linear(8, 8)

    def forward(self, x):
        return x + self.mixer(x)


class CustomBlocks(torch.nn.Module):  # no transformers base class: no native support, names outside the aliases
    def __init__(self):
        super().__init__()
        self.blocks = torch.nn.ModuleList([Block() for _ in range(3)])


def test_full_without_support_takes_submodules_and_warns_on_zero_wrapped():
    prep = prepare(CustomBlocks(), "full")
    assert prep.full_route == "submodules"
    assert "does not declare checkpointing support" in prep.full_route_reason
    assert prep.discovery.how.startswith("largest container blocks")
    assert prep.layers_wrapped + prep.submodules_wrapped == 0
    assert "0 modules wrapped" in prep.warnings[-1]


def test_compile_is_checked_before_the_native_conditions():
    prep = prepare(CustomBlocks(), "full", compile=True)
    assert prep.full_route == "compile"


@pytest.mark.parametrize("mode", ["full", "selective"])
def test_kv_sharing_keeps_cache_and_never_checkpoints_attention(mode):
    m = models.gemma3n_text()
    prep = prepare(m, mode, compile=True)  # compile on too: KV sharing comes first
    assert prep.kv_sharing and prep.use_cache_disabled == [] and m.config.use_cache is True
    for p in prep.layers:
        assert p.layer == "off"
        assert p.submodules == ["mlp", "input_layernorm", "post_attention_layernorm"]
    if mode == "full":
        assert prep.full_route == "submodules" and "KV sharing" in prep.full_route_reason
    else:
        assert "selective with KV sharing degrades" in prep.warnings[0]


def test_selective_wraps_every_layer_of_both_towers_whole():
    m = models.llava()
    prep = prepare(m, "selective")
    assert prep.full_route is None and prep.layers_wrapped == 4 and prep.submodules_wrapped == 0
    assert [p.role for p in prep.layers] == ["language"] * 2 + ["vision"] * 2
    assert all(p.layer == "selective" and "forward" in p.module.__dict__ for p in prep.layers)


def test_per_layer_plan_and_keys_unchanged():
    m = models.llama()
    keys = list(m.state_dict().keys())
    names = [n for n, _ in m.named_parameters()]
    prep = prepare(m, "selective", '  layers: {0: off, "1-2": full}\n')
    assert [p.mode for p in prep.layers] == ["off", "full", "full"]
    assert prep.full_route == "native"
    assert [layer.gradient_checkpointing for layer in m.model.layers] == [False, True, True]
    assert list(m.state_dict().keys()) == keys and [n for n, _ in m.named_parameters()] == names
    hf.unprepare(m, prep)
    assert not m.is_activation_checkpointing


def test_errors_come_from_the_cpp_parser_with_file_line_col():
    with pytest.raises(RuntimeError, match=r"bad\.yaml:2:9: activation_checkpoint\.mode: 'sometimes' is not allowed; "
                                           r"allowed: off, full, selective"):
        hf.parse_config("activation_checkpoint:\n  mode: sometimes\n", "bad.yaml")
    with pytest.raises(RuntimeError, match=r"bad\.yaml:1:1: .*'trian'"):
        hf.parse_config("trian: {steps: 1}\n", "bad.yaml")
    with pytest.raises(RuntimeError, match="registry"):
        hf.load_registry("/nonexistent/registry.yaml")


def test_plan_out_of_range_and_swap_conflict():
    with pytest.raises(ValueError, match=r"test\.yaml:4:\d+: activation_checkpoint\.layers: layer 3 is out of range; the language tower model\.layers holds layers 0, 1, 2"):
        prepare(models.llama(), "full", "  layers: {3: off}\n")
    with pytest.raises(ValueError, match="cannot be combined with activation_swap: attention"):
        prepare(models.llama(), "full", "activation_swap: attention\n")
