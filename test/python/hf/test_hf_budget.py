"""hpac.hf in budget mode: activation_checkpoint.memory_budget through the C++ parser (values, and every rejection
with file:line:col), one hpac.budget region per layer, and the tiny Qwen3MoeForCausalLM trained under budgets 0, 0.5
and 1 with loss and every gradient bitwise equal to the off run (every budget in {0, 0.25, 0.5, 0.75, 1}: on the MoE
block in test/python/test_budget.py and on the C++ trainer in test/trainer/budget_test.cpp; three here keep CI
short)."""
import pytest

import hpac.hf as hf
import hpac.harness.compare as hc
import hpac.harness.models as hm
import models

STEPS = 2


def test_memory_budget_reaches_python_as_the_parser_read_it():
    c = hf.parse_config("activation_checkpoint:\n  mode: budget\n  memory_budget: 0.3\n", "b.yaml")
    assert c["activation_checkpoint"]["mode"] == "budget"
    assert c["activation_checkpoint"]["memory_budget"] == {"fraction": 0.3, "bytes": None, "text": "0.3",
                                                           "where": "b.yaml:3:18"}
    c = hf.parse_config("activation_checkpoint: {mode: budget, memory_budget: 64MiB}\n", "b.yaml")
    assert c["activation_checkpoint"]["memory_budget"]["bytes"] == 64 << 20
    assert c["activation_checkpoint"]["memory_budget"]["fraction"] is None
    assert hf.parse_config("activation_checkpoint: {mode: full}\n")["activation_checkpoint"]["memory_budget"] is None


@pytest.mark.parametrize("text, message", [
    ("  mode: budget\n  memory_budget: 1.5\n",
     r"b\.yaml:3:18: activation_checkpoint\.memory_budget: '1\.5' is outside \[0, 1\] .*allowed: a fraction in \[0, 1\]"),
    ("  mode: budget\n  memory_budget: -5MiB\n",
     r"b\.yaml:3:18: activation_checkpoint\.memory_budget: '-5MiB' is negative; allowed: "),
    ("  mode: selective\n  memory_budget: 0.3\n",
     r"b\.yaml:3:18: activation_checkpoint\.memory_budget: '0\.3' is set but no layer uses mode budget"),
    ("  mode: budget\n",
     r"b\.yaml:2:9: activation_checkpoint\.mode: 'budget' needs activation_checkpoint\.memory_budget"),
])
def test_bad_budgets_are_the_parsers_errors(text, message):
    with pytest.raises(RuntimeError, match=message):
        hf.parse_config("activation_checkpoint:\n" + text, "b.yaml")


def test_budgets_train_the_qwen3_moe_bit_for_bit_with_off():
    config = hf.parse_config(models.QWEN3_MOE_YAML % "off", "level0.yaml")
    spec, train = config["model"], config["train"]
    budgets = ["budget:0", "budget:0.5", "budget:1"]
    runs = hc.train_compare(
        lambda: models.qwen3_moe(spec), config,
        lambda step: hm.token_batch(spec["vocab_size"], train["micro_batch"], train["seq_len"], train["seed"], step),
        steps=STEPS, modes=["off"] + budgets, lr=train["lr"], log=None)
    off = runs["off"]
    for mode in budgets:
        run = runs[mode]
        assert run.prep.route == "budget" and run.prep.layers_wrapped == spec["num_layers"]
        for step in range(STEPS):
            assert run.losses[step].item() == off.losses[step].item(), (mode, step)
        assert run.max_dloss == 0.0 and run.max_dgrad == 0.0, (mode, run.max_dloss, run.max_dgrad)
        regions = [layer.budget for layer in run.prep.layers]
        assert len({id(r) for r in regions}) == spec["num_layers"]  # one region per layer
        for r in regions:
            st = r.status()
            assert st["stage"] == "planned" and st["kept_bytes"] <= st["budget_bytes"], (mode, st)
        if mode == "budget:0":  # only outputs without bytes (scalars) are kept
            assert all(r.status()["kept_bytes"] == 0 for r in regions)
        if mode == "budget:1":
            assert all(0 < r.status()["kept_bytes"] <= r.status()["budget_bytes"] == r.status()["off_bytes"]
                       < r.status()["total_bytes"] for r in regions)
            assert sum(s["served"] for s in run.layer_stats[-1]) > 0
            assert sum(s["skipped"] for s in run.layer_stats[-1]) > 0  # Note [Dead ops are skipped]
    print("\n" + hc.format_table(hc.summary(runs)))


def test_a_hand_written_dict_is_checked_like_the_yaml():
    """prepare takes the config as a Python user writes it, checked by the C++ parser (it raised TypeError: 'float'
    object is not subscriptable before)."""
    config = {"activation_checkpoint": {"mode": "budget", "memory_budget": 0.5}}
    spec = hf.parse_config(models.QWEN3_MOE_YAML % "off")["model"]
    prep = hf.prepare(models.qwen3_moe(spec), config, log=None)
    assert prep.route == "budget" and all(layer.budget.fraction == 0.5 for layer in prep.layers)
    with pytest.raises(RuntimeError, match=r"<the dict given to hpac\.hf\.prepare>:\d+:\d+: activation_checkpoint\."
                                           r"memory_budget: '1\.5' is outside \[0, 1\].*allowed: "):
        hf.prepare(models.qwen3_moe(spec), {"activation_checkpoint": {"mode": "budget", "memory_budget": 1.5}}, log=None)
    with pytest.raises(RuntimeError, match=r"activation_checkpoint\.mode: 'sometimes' is not allowed"):
        hf.prepare(models.qwen3_moe(spec), {"activation_checkpoint": {"mode": "sometimes"}}, log=None)
