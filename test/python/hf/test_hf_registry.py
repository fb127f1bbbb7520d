"""The registry checked against reality: every class tools/trainer/model_registry.yaml lists is built from a tiny
config (on the meta device: the module tree is real, no memory, nothing downloaded) and discovery must find its
language tower, its vision tower where the family has one, with the layer counts the config asked for. Classes
transformers lacks (or that need packages the project does not install) are reported, not silently passed."""
import pytest
import torch
import transformers

import hpac.hf as hf

LAYER_KEYS = ("num_hidden_layers", "depth", "num_layers", "n_layer")
N_LANGUAGE, N_VISION = 2, 3  # different, so a tower found at the other tower's path fails

# Families whose class exists but whose tiny build needs a package the project does not install.
NEEDS = {"Gemma3nForConditionalGeneration": "timm and pillow (its vision tower is a TimmWrapperModel)"}
REPORT = []


def _layer_keys(config):
    return [k for k in LAYER_KEYS if k in config.to_dict()]


def tiny_config(config_cls):
    """The class's default config with the language tower set to N_LANGUAGE layers and the vision tower to
    N_VISION (sub-configs that default to None are created from their class)."""
    subs = getattr(config_cls, "sub_configs", None) or {}
    base = config_cls()

    def sub(key, layers):
        inst = getattr(base, key, None) or subs[key]()
        return {"model_type": inst.model_type, **{k: layers for k in _layer_keys(inst)}}

    kwargs = {}
    if "text_config" in subs:
        kwargs["text_config"] = sub("text_config", N_LANGUAGE)
    else:
        kwargs.update({k: N_LANGUAGE for k in _layer_keys(base)})
    if "vision_config" in subs:
        kwargs["vision_config"] = sub("vision_config", N_VISION)
    return config_cls(**kwargs)


def _expected_language_layers(config):
    text = getattr(config, "text_config", None) or config
    for k in LAYER_KEYS:
        if isinstance(getattr(text, k, None), int):
            return getattr(text, k)
    raise AssertionError(f"{type(text).__name__} names no layer count")


def build_meta(cls_name):
    cls = getattr(transformers, cls_name)
    config = tiny_config(cls.config_class)
    with torch.device("meta"):
        return cls(config), config


def _registry_classes():
    return sorted(hf.load_registry()["models"].items())


@pytest.mark.parametrize("cls_name,entry", _registry_classes(), ids=[c for c, _ in _registry_classes()])
def test_registry_entry_on_the_real_class(cls_name, entry):
    if not hasattr(transformers, cls_name):
        REPORT.append(f"{entry['family']:<18} {cls_name:<40} not in transformers {transformers.__version__}")
        pytest.skip(f"{cls_name} (family {entry['family']}) is not a class of transformers {transformers.__version__}")
    if cls_name in NEEDS:
        REPORT.append(f"{entry['family']:<18} {cls_name:<40} not built: needs {NEEDS[cls_name]}")
        pytest.skip(f"{cls_name} needs {NEEDS[cls_name]}")
    model, config = build_meta(cls_name)
    d = hf.discover(model)
    language = d.language()
    assert language is not None and language.path in entry["language"], d.how
    assert len(language.layers) == _expected_language_layers(config), d.how
    assert d.how.startswith(f"registry: {cls_name}")
    found = [f"language {language.path} ({len(language.layers)})"]
    if entry["vision"]:
        vision = d.vision()
        assert vision is not None, f"{cls_name}: no vision tower at any of {entry['vision']}; {d.how}"
        assert vision.path in entry["vision"]
        assert len(vision.layers) == N_VISION, d.how
        found.append(f"vision {vision.path} ({len(vision.layers)})")
    else:
        assert d.vision() is None
    REPORT.append(f"{entry['family']:<18} {cls_name:<40} {', '.join(found)}")


# The retrieval wrappers of the reference design, shaped as it describes: a bi-encoder holding one encoder, a
# cross-encoder holding the scoring model, an FSDP bi-encoder holding the bi-encoder as `module`.
class BiEncoderModel(torch.nn.Module):
    def __init__(self, encoder):
        super().__init__()
        self.encoder = encoder


class CrossEncoderModel(torch.nn.Module):
    def __init__(self, model):
        super().__init__()
        self.model = model


class FSDPBiEncoderModel(torch.nn.Module):
    def __init__(self, module):
        super().__init__()
        self.module = module


@pytest.mark.parametrize("wrap,prefix", [
    (lambda m: BiEncoderModel(m), "encoder."),
    (lambda m: CrossEncoderModel(m), "model."),
    (lambda m: FSDPBiEncoderModel(BiEncoderModel(m)), "module.encoder."),
], ids=["BiEncoderModel", "CrossEncoderModel", "FSDPBiEncoderModel"])
def test_retrieval_wrappers_reach_the_inner_model(wrap, prefix):
    inner, config = build_meta("Qwen3ForCausalLM")
    d = hf.discover(wrap(inner))
    assert d.language().path == prefix + "model.layers", d.how
    assert len(d.language().layers) == config.num_hidden_layers
    assert d.inner_model is inner
    assert "retrieval wrapper" in d.how


def test_zz_report():
    """Prints the per-family table (run with -s, or see the closing note); fails if no family was checked."""
    print("\nregistry vs transformers " + transformers.__version__ + ":\n" + "\n".join(REPORT))
    assert any("language" in line for line in REPORT)
