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
