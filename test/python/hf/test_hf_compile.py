"""train.compile: true in hpac.hf: the reference rules applied, then each layer compiled (module.compile()); the
real transformers Qwen3MoeForCausalLM (its default experts 'grouped_mm', compile-friendly) trained compiled under
off / full / selective: parity with eager off, one compile for every layer and step, no graph break, state_dict keys
unchanged; a budget with compile refused before training."""
import pytest
import torch
import torch._dynamo.testing

import hpac
import hpac._compile as hpac_compile
import hpac.hf as hf
import hpac.harness.compare as hc
import hpac.harness.models as hm
import models

STEPS = 3
TOLERANCE = 1e-5  # fp32 (aot_eager is bitwise here; the tolerance covers the experts kernel's reassociation)


def _yaml(mode, compile_on):
    return hf.parse_config((models.QWEN3_MOE_YAML % mode).replace("seed: 1234}", f"seed: 1234, compile: "
                                                                   f"{'true' if compile_on else 'false'}}}"),
                           "compile.yaml")


def _model(spec):
    """use_cache off in every run, the eager reference too: off leaves the model's config as it is (a KV cache then
    grows inside each layer, and its state guards the compiled graph), the checkpointed modes turn it off."""
    model = models.qwen3_moe(spec)
    model.config.use_cache = False
    return model


def _batch(spec, train):
    return lambda step: hm.token_batch(spec["vocab_size"], train["micro_batch"], train["seq_len"], train["seed"], step)


def test_compiled_layers_match_eager_off_with_one_compile_and_no_graph_break():
    eager = _yaml("off", False)
    spec, train = eager["model"], eager["train"]
    ref = hc.train_compare(lambda: _model(spec), eager, _batch(spec, train), steps=STEPS, modes=("off",),
                           lr=train["lr"])["off"]
    keys = list(models.qwen3_moe(spec).state_dict())
    for mode in ("off", "full", "selective"):
        torch._dynamo.reset()
        torch._dynamo.utils.counters.clear()
        hpac_compile.TRACED.clear()
        hpac_compile.RECORD = True  # read below (off by default)
        backend = torch._dynamo.testing.CompileCounterWithBackend("aot_eager")
        config = _yaml(mode, True)
        run = hc.train_compare(lambda: _model(spec), config, _batch(spec, train), steps=STEPS,
                               modes=(mode,), lr=train["lr"], compile_backend=backend)[mode]
        assert run.prep.compiled == [f"model.layers.{i}" for i in range(spec["num_layers"])], run.prep.compiled
        assert list(run.model.state_dict()) == keys  # module.compile() in place: no _orig_mod. prefix
        for step in range(STEPS):
            assert hc.max_abs_diff(run.losses[step], ref.losses[step]) <= TOLERANCE, (mode, step)
        for p, p0 in zip(run.model.parameters(), ref.model.parameters()):
            assert hc.max_abs_diff(p, p0) <= TOLERANCE, mode
        # Every layer has one shape: one graph for all of them, over every step; nothing broke a layer's graph.
        assert backend.frame_count == 1, (mode, backend.frame_count)
        assert not torch._dynamo.utils.counters["graph_break"], dict(torch._dynamo.utils.counters["graph_break"])
        if mode != "off":
            assert hpac_compile.TRACED, f"{mode}: hpac's policy was never asked"
            assert run.layer_stats[-1][0]["invocations"] == 0  # no eager invocation behind the compiled layer


def test_budget_with_compile_is_refused_before_training():
    config = _yaml("budget, memory_budget: 0.5", True)
    with pytest.raises(ValueError, match="budget .*cannot be combined with train.compile: true"):
        hf.prepare(models.qwen3_moe(config["model"]), config, log=None)


@pytest.mark.parametrize("mode", ["selective", "off"])
def test_unprepare_undoes_the_compile(mode):
    config = _yaml(mode, True)
    model = models.qwen3_moe(config["model"])
    prep = hf.prepare(model, config, log=None, compile_backend="aot_eager")
    assert all(layer._compiled_call_impl is not None for layer in model.model.layers)
    hf.unprepare(model, prep)
    assert all(layer._compiled_call_impl is None and "forward" not in layer.__dict__ for layer in model.model.layers)
