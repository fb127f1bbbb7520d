"""The trainer YAML's Qwen3-MoE as a transformers model: Qwen3MoeForCausalLM built from the YAML's `model` section
with random weights (nothing downloaded). hpac plan builds it on the meta device (hpac.plan); the tests, demo and
benchmarks through hpac.harness.models."""
import torch


def qwen3_moe_config(model_spec, **overrides):
    """A transformers Qwen3MoeConfig from the trainer YAML's `model` section (the keys are Hugging Face's)."""
    import transformers
    keys = ("hidden_size", "num_attention_heads", "num_key_value_heads", "head_dim", "intermediate_size",
            "moe_intermediate_size", "num_experts", "num_experts_per_tok", "vocab_size", "norm_topk_prob",
            "rope_theta", "rms_norm_eps")
    kwargs = {k: model_spec[k] for k in keys}
    kwargs["num_hidden_layers"] = model_spec["num_layers"]
    kwargs.setdefault("max_position_embeddings", 4096)
    kwargs.update(overrides)
    rope_theta = kwargs.pop("rope_theta")
    cfg = transformers.Qwen3MoeConfig(**kwargs)
    cfg.rope_parameters = {"rope_type": "default", "rope_theta": rope_theta}
    cfg._attn_implementation = "sdpa"
    return cfg


def qwen3_moe_model(model_spec, seed, dtype=None, device=None, **overrides):
    """The one Qwen3-MoE builder: a transformers Qwen3MoeForCausalLM with random weights drawn after
    torch.manual_seed(seed), in train mode. dtype: built in it (the default dtype while building, so the experts
    have no float32 copy); device: built on it (torch >= 2.0); overrides: Qwen3MoeConfig fields (e.g.
    max_position_embeddings for a longer sequence)."""
    import transformers
    torch.manual_seed(seed)
    cfg = qwen3_moe_config(model_spec, **overrides)
    default = torch.get_default_dtype()
    if dtype is not None:
        torch.set_default_dtype(dtype)
    try:
        if device is None:
            model = transformers.Qwen3MoeForCausalLM(cfg)
        else:
            with torch.device(device):
                model = transformers.Qwen3MoeForCausalLM(cfg)
    finally:
        torch.set_default_dtype(default)
    model.train()
    return model
