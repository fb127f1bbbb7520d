"""The C++ trainer and the Python integration must not drift: the same YAML goes through hpac-train (on its C++ zoo
model) and through hpac.hf.prepare (on the equivalent real transformers model); the route and the wrap counts
(whole layers, submodules) must be the same."""
import os
import re
import subprocess

import pytest

import hpac.hf as hf
import models


def _hpac_train():
    path = os.environ.get("HPAC_TRAIN")
    if not path:
        pytest.skip("HPAC_TRAIN (the hpac-train binary) is not set; the CTest entry python.hf sets it")
    return path


def equivalent_model(spec):
    """The transformers model the zoo preset replicates, with the preset's layer counts."""
    preset = spec["preset"]
    if preset.startswith("qwen3_moe"):
        return models.qwen3_moe(spec)
    if preset == "llava_tiny":
        return models.llava(text_layers=spec["num_layers"], vision_layers=spec["num_layers"])
    if preset == "gemma3n_kv_tiny":
        return models.gemma3n_text(layers=spec["num_layers"], shared=spec["num_kv_shared_layers"])
    raise AssertionError(f"no transformers equivalent for preset {preset}")


CASES = {
    "qwen3_full": "model: {preset: qwen3_moe_tiny}\nactivation_checkpoint: {mode: full}\n",
    "qwen3_full_compile": "model: {preset: qwen3_moe_tiny}\ntrain: {compile: true}\nactivation_checkpoint: {mode: full}\n",
    "qwen3_selective": "model: {preset: qwen3_moe_tiny}\nactivation_checkpoint: {mode: selective}\n",
    "qwen3_plan": ("model: {preset: qwen3_moe_tiny}\nactivation_checkpoint:\n  mode: selective\n"
                   "  layers: {0: off, \"2-3\": full}\n"),
    "llava_full": "model: {preset: llava_tiny}\nactivation_checkpoint: {mode: full}\n",
    "llava_full_compile": "model: {preset: llava_tiny}\ntrain: {compile: true}\nactivation_checkpoint: {mode: full}\n",
    "llava_selective": "model: {preset: llava_tiny}\nactivation_checkpoint: {mode: selective}\n",
    "gemma3n_kv_full": "model: {preset: gemma3n_kv_tiny}\nactivation_checkpoint: {mode: full}\n",
    "gemma3n_kv_selective": "model: {preset: gemma3n_kv_tiny}\nactivation_checkpoint: {mode: selective}\n",
}


def _cpp(path):
    out = subprocess.run([_hpac_train(), "--config", path, "--steps", "1"], capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr
    route = re.search(r"\[hpac-train\] full: (\w+) path", out.stderr)
    wrapped = re.search(r"\[hpac-train\] wrapped (\d+) layers whole and (\d+) submodules", out.stderr)
    assert wrapped, out.stderr
    return (route.group(1) if route else None), int(wrapped.group(1)), int(wrapped.group(2))


@pytest.mark.parametrize("name", sorted(CASES))
def test_same_yaml_same_route_and_wrap_counts(name, tmp_path):
    path = tmp_path / f"{name}.yaml"
    path.write_text(CASES[name] + "train: {seq_len: 8, micro_batch: 1, steps: 1}\n"
                    if "train:" not in CASES[name] else CASES[name].replace("train: {", "train: {seq_len: 8, "))
    config = hf.load_config(path)
    prep = hf.prepare(equivalent_model(config["model"]), config, log=None)
    py = (prep.full_route, prep.layers_wrapped, prep.submodules_wrapped)
    assert _cpp(str(path)) == py, f"{name}: C++ (route, layers, submodules) differs from Python {py}"
    assert prep.layers_wrapped + prep.submodules_wrapped > 0


def test_one_table_for_the_main_job(tmp_path):
    """hpac-train --compare and hpac.harness.compare print one table (Note [One table for the main job],
    tools/trainer/trainer.cpp): the same header, the same route and wrap words per mode, the same sign convention
    (every checkpointed mode's peak_vs_off negative here), and a budget footer saying what the plans keep."""
    import hpac.harness.compare as hc
    import hpac.harness.models as hm

    path = tmp_path / "main_job.yaml"
    path.write_text("model: {preset: qwen3_moe_tiny, num_layers: 2}\ntrain: {seq_len: 32, micro_batch: 2, steps: 2}\n"
                    "activation_checkpoint: {mode: budget, memory_budget: 0.5}\n")
    out = subprocess.run([_hpac_train(), "--config", str(path), "--compare"], capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stdout + out.stderr
    config = hf.load_config(path)
    spec, train = config["model"], config["train"]
    runs = hc.train_compare(
        lambda: models.qwen3_moe(spec), config,
        lambda step: hm.token_batch(spec["vocab_size"], train["micro_batch"], train["seq_len"], train["seed"], step),
        steps=train["steps"], modes=hc.MODES + ("budget",), lr=train["lr"], log=None)
    py = hc.format_table(hc.summary(runs, config["activation_checkpoint"]["memory_budget"]["text"])).splitlines()

    def table(lines):
        start = next(i for i, line in enumerate(lines) if line.startswith("mode "))
        rows = [line.split() for line in lines[start + 1:start + 5]]
        footer = [line for line in lines[start + 5:] if line.startswith("budget (")]
        return lines[start], rows, footer

    cpp_head, cpp_rows, cpp_footer = table(out.stdout.splitlines())
    py_head, py_rows, py_footer = table(py)
    assert cpp_head == py_head
    for c, p in zip(cpp_rows, py_rows):
        assert c[0] == p[0]  # mode
        words = lambda row: row[row.index("ms") + 4:-2]  # route and wrapped, after time_vs_off and the diffs
        assert words(c) == words(p), (c, p)
        if c[0] != "off":
            assert c[3].startswith("-") and p[3].startswith("-"), (c, p)  # less memory than off: negative
    assert len(cpp_footer) == len(py_footer) == 1
    for footer in (cpp_footer[0], py_footer[0]):
        assert re.match(r"budget \(memory_budget 0\.5 per layer\): 2 layer plans keep [\d.]+ MiB of the [\d.]+ MiB "
                        r"off keeps \(\d+%\); \d+ of \d+ ops saved, \d+ skipped; \d+% of the recompute's profiled "
                        r"kernel time avoided$", footer), footer
