"""Level0 on real transformers models: the tiny Qwen3MoeForCausalLM (4 layers, hidden 128, 8 experts top-2, SDPA)
and a dense Llama, trained with AdamW for 5 steps under off, full and selective from the same seed. Loss and every
gradient bitwise equal to the off run (the op order is the same: hpac serves the forward's own outputs, and the
recompute runs the same kernels on the same inputs), recompute counters > 0 on every wrapped layer, ops served from
hpac's cache under selective, and peak tensor memory below off in both modes. The parameters after the last AdamW
step are compared directly too (torch.equal), independently of the comparison helper."""
import pytest
import torch

import hpac
import hpac.hf as hf
import hpac.harness.compare as hc
import hpac.harness.models as hm
import models

STEPS = 5


def _check(runs, layers, compiled=False):
    off = runs["off"]
    for mode in ("full", "selective"):
        run = runs[mode]
        for step in range(STEPS):
            assert torch.equal(run.losses[step], off.losses[step]), (mode, step)
        assert run.max_dloss == 0.0 and run.max_dgrad == 0.0, (mode, run.max_dloss, run.max_dgrad)
        for (name, p), p0 in zip(run.model.named_parameters(), off.model.parameters()):
            assert torch.equal(p, p0), f"{mode}: parameter {name} differs from off after {STEPS} AdamW steps"
        assert run.prep.layers_wrapped + run.prep.submodules_wrapped > 0
        for step_stats in run.layer_stats:
            assert len(step_stats) == layers
            for i, s in enumerate(step_stats):
                if compiled:  # the compiler recomputes; no eager hpac invocation runs
                    assert s["invocations"] == 0, (mode, i, s)
                    continue
                assert s["invocations"] > 0 and s["recomputed"] > 0, (mode, i, s)
                if mode == "selective":
                    assert s["served"] > 0, (mode, i, s)
                else:
                    assert s["served"] == 0 and s["saved"] == 0, (mode, i, s)
        assert max(run.peaks[1:]) < max(off.peaks[1:]), (mode, run.peaks, off.peaks)
    assert off.layer_stats[-1] == [] and not off.prep.touched


def test_level0_qwen3_moe():
    config = hf.parse_config(models.QWEN3_MOE_YAML % "off", "level0.yaml")
    spec, train = config["model"], config["train"]
    runs = hc.train_compare(
        lambda: models.qwen3_moe(spec), config,
        lambda step: hm.token_batch(spec["vocab_size"], train["micro_batch"], train["seq_len"], train["seed"], step),
        steps=STEPS, lr=train["lr"], log=None)
    assert runs["full"].prep.full_route == "native"
    assert type(runs["off"].model).__name__ == "Qwen3MoeForCausalLM"
    _check(runs, spec["num_layers"])
    print("\n" + hc.format_table(hc.summary(runs)))


def test_level0_dense_llama_submodule_route():
    """A different block shape (dense SwiGLU MLP) and the other full route: compile on sends full to the attention
    and MLP submodules, and every layer is compiled after wrapping (aot_eager here: AOTAutograd and its partitioner
    without code generation, so compiled full and selective equal compiled off bit for bit)."""
    config = hf.parse_config("train: {compile: true}\n", "level0_llama.yaml")
    torch._dynamo.reset()
    runs = hc.train_compare(models.llama, config, lambda step: hm.token_batch(256, 2, 32, 99, step), steps=STEPS,
                            log=None, compile_backend="aot_eager")
    assert runs["full"].prep.full_route == "compile"
    for run in runs.values():
        assert run.prep.compiled == [f"model.layers.{i}" for i in range(3)], run.prep.compiled
    _check(runs, 3, compiled=True)
    print("\n" + hc.format_table(hc.summary(runs)))


def test_level0_qwen3_moe_yaml_policy_torchtitan():
    """activation_checkpoint.policy (docs/trainer.md): selective runs torchtitan's rules (policy/field_policies.h),
    its force-recompute shape the router's (hidden, experts); bitwise equal to off, keeping other tensors than the
    built-in rules."""
    yaml = models.QWEN3_MOE_YAML % 'selective, policy: torchtitan, policy_params: ["128x8"]'
    config = hf.parse_config(yaml, "level0_torchtitan.yaml")
    assert config["activation_checkpoint"]["policy"] == "torchtitan"
    assert config["activation_checkpoint"]["policy_params"] == ["128x8"]
    spec, train = config["model"], config["train"]

    def compare(cfg, modes, steps):
        return hc.train_compare(
            lambda: models.qwen3_moe(spec), cfg,
            lambda step: hm.token_batch(spec["vocab_size"], train["micro_batch"], train["seq_len"], train["seed"],
                                        step),
            steps=steps, modes=modes, lr=train["lr"], log=None)

    runs = compare(config, ("off", "full", "selective"), STEPS)
    _check(runs, spec["num_layers"])
    builtin = compare(hf.parse_config(models.QWEN3_MOE_YAML % "selective", "level0.yaml"), ("selective",), 1)
    got, ref = runs["selective"].layer_stats[0][0], builtin["selective"].layer_stats[0][0]
    assert (got["saved"], got["saved_bytes"]) != (ref["saved"], ref["saved_bytes"]), (got, ref)


def test_yaml_policy_errors_name_the_line():
    with pytest.raises(RuntimeError, match=r"t.yaml:1:\d+: activation_checkpoint.policy_params: hpac: shape '128' is "
                                         r"not allowed; allowed: 'INxOUT'"):
        hf.parse_config('activation_checkpoint: {mode: selective, policy: torchtitan, policy_params: ["128"]}\n',
                        "t.yaml")
