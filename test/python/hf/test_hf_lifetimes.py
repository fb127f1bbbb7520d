"""Lifetimes through hpac.hf.prepare (Note [Nothing outlives its model], plugin/python/hpac/_regions.py;
docs/reliability.md, "Memory across a run"), on the tiny real Qwen3MoeForCausalLM, per prepared mode: forwards whose
graphs are dropped without backward, steps that never call take_layer_stats(), steps that end in an exception inside
a layer's forward or its recompute, and prepared models that are dropped. After each, with gc.collect(): live CPU
tensor bytes (hpac's tracking allocator) exactly where they were, no hpac.Invocation alive, the model, its layers,
parameters and Budgets collected, and the next step bitwise equal to the same step of the model never prepared."""
import copy
import gc
import weakref

import pytest
import torch

import hpac
import hpac.hf as hf
import hpac.harness.models as hm
import models

pytestmark = pytest.mark.usefixtures("only_new_objects_scanned")  # test/python/conftest.py

N = 3
MODES = {  # name -> (activation_checkpoint.mode line, train.compile)
    "off": ("off", False),
    "full": ("full", False),
    "selective": ("selective", False),
    "budget": ("budget, memory_budget: 0.5", False),
    "torchtitan": ("selective, policy: torchtitan", False),
    "compile": ("selective", True),
}


class Fault(Exception):
    pass


def _config(mode):
    line, compile_on = MODES[mode]
    config = hf.parse_config(models.QWEN3_MOE_YAML % line, f"{mode}.yaml")
    config["train"]["compile"] = compile_on
    return config


def _batch(config, step):
    spec, train = config["model"], config["train"]
    return hm.token_batch(spec["vocab_size"], train["micro_batch"], train["seq_len"], train["seed"], step)


def _prepared(mode):
    config = _config(mode)
    model = models.qwen3_moe(config["model"])
    reference = copy.deepcopy(model)
    prep = hf.prepare(model, config, log=None, compile_backend="aot_eager")
    return config, model, reference, prep


def _step(model, ids, step):
    torch.manual_seed(step)
    loss = model(input_ids=ids, labels=ids).loss
    loss.backward()
    out = [loss.detach()] + [p.grad.clone() for p in model.parameters()]
    model.zero_grad(set_to_none=True)
    return out


def _live_bytes():
    gc.collect()
    return hpac.cpu_tensor_memory_stats()["current_bytes"]


def _live(kind):
    gc.collect()
    return sum(1 for o in gc.get_objects() if type(o) is kind)


def _reset_compiled():
    """Compiled code caches guard on the module they compiled until torch._dynamo.reset()."""
    if hasattr(torch, "_dynamo"):
        torch._dynamo.reset()


@pytest.fixture(autouse=True)
def tracked():
    hpac.track_memory()
    _reset_compiled()
    yield


@pytest.mark.parametrize("mode", sorted(MODES))
def test_dropped_forwards_and_untaken_stats_stay_flat(mode):
    config, model, _, prep = _prepared(mode)
    ids = _batch(config, 0)
    _step(model, ids, 0)  # a budget profiles and plans; a compiled layer compiles
    baseline = _live_bytes()
    for i in range(N):
        out = model(input_ids=ids, labels=ids)  # evaluation in train mode, a skipped micro-batch
        del out
        assert _live_bytes() == baseline, f"{mode}: dropped forward {i + 1} left {_live_bytes() - baseline} bytes"
    for i in range(2 * N):  # take_layer_stats() never called
        _step(model, ids, i)
        assert _live_bytes() == baseline, f"{mode}: step {i + 1} left {_live_bytes() - baseline} bytes"
    assert _live(hpac.Invocation) == 0 and torch.ops.hpac.invocations_alive() == 0
    assert all(layer._tally.live == 0 for layer in prep.layers)
    calls = 1 + N + 2 * N  # the warm-up step, N dropped forwards, 2N steps: each counted once
    for layer, stats in zip(prep.layers, prep.take_layer_stats()):
        regions = (layer.layer != "off") + len(layer.submodules)  # checkpoint calls per layer call
        if layer.compiled:
            regions = 0  # compiled code runs no eager invocation
        assert stats["invocations"] == regions * calls, (mode, layer.path, stats)
        assert stats.get("recomputes", 0) == regions * (1 + 2 * N), (mode, layer.path, stats)


@pytest.mark.parametrize("mode", sorted(MODES))
def test_dropped_prepared_models_are_collected(mode):
    baseline = _live_bytes()
    invocations = _live(hpac.Invocation)
    for i in range(N):
        config, model, reference, prep = _prepared(mode)
        ids = _batch(config, 0)
        _step(model, ids, 0)
        out = model(input_ids=ids, labels=ids)  # a graph alive when the model goes
        watched = [weakref.ref(model), weakref.ref(model.model.layers[0]), weakref.ref(next(model.parameters()))]
        watched += [weakref.ref(layer.budget) for layer in prep.layers if layer.budget is not None]
        del model, reference, prep, out, ids
        _reset_compiled()
        gc.collect()
        assert all(w() is None for w in watched), f"{mode}: the model or a Budget outlived its last reference"
        assert _live_bytes() == baseline, f"{mode}: {_live_bytes() - baseline} bytes outlived model {i + 1}"
    assert _live(hpac.Invocation) == invocations


@pytest.mark.parametrize("mode", ["full", "selective", "budget", "torchtitan"])
@pytest.mark.parametrize("where", ["forward", "recompute"])
def test_an_exception_in_a_layer_leaves_nothing_behind(mode, where):
    config, model, reference, prep = _prepared(mode)
    ids = _batch(config, 0)
    _step(model, ids, 0)
    _step(reference, ids, 0)
    baseline = _live_bytes()
    target = model.model.layers[1].mlp
    calls = []

    def fault(module, args):
        calls.append(1)
        phase = "forward" if len(calls) == 1 else "recompute"
        if phase == where:
            raise Fault(f"raised in the {phase} of layer 1's mlp")
    for i in range(N):
        calls.clear()
        handle = target.register_forward_pre_hook(fault)
        try:
            with pytest.raises(Fault):
                _step(model, ids, 100 + i)
        finally:
            handle.remove()
        model.zero_grad(set_to_none=True)
        if where == "forward":  # after a failed backward, libtorch's engine may keep its pending tasks until the
            assert _live_bytes() == baseline, f"{mode}, {where} {i + 1}: {_live_bytes() - baseline} bytes left"
        _step(model, ids, 50 + i)  # next backward (test/python/test_lifetimes.py): compared after the next step
        assert _live_bytes() == baseline, f"{mode}, {where} {i + 1}: {_live_bytes() - baseline} bytes after a step"
    assert _live(hpac.Invocation) == 0 and torch.ops.hpac.invocations_alive() == 0
    got, ref = _step(model, ids, 7), _step(reference, ids, 7)
    assert all(torch.equal(a, b) for a, b in zip(got, ref)), f"{mode}: the step after the exceptions differs from off"
    del got, ref
    assert _live_bytes() == baseline
