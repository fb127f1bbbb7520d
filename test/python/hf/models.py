"""Tiny real transformers models for the hpac.hf tests (random weights from a seed; nothing downloaded)."""
import torch
import transformers

import hpac.harness.models as hm

# The trainer YAML's model section of the Level0 model: Qwen3-MoE, 4 layers, hidden 128, 8 experts top-2.
QWEN3_MOE_YAML = """\
model: {preset: qwen3_moe_tiny, num_layers: 4, hidden_size: 128, num_attention_heads: 4, num_key_value_heads: 2,
        head_dim: 32, moe_intermediate_size: 64, num_experts: 8, num_experts_per_tok: 2, vocab_size: 256}
train: {seq_len: 32, micro_batch: 2, steps: 5, lr: 1.0e-3, seed: 1234}
activation_checkpoint: {mode: %s}
"""


def seeded(fn, seed=1234):
    torch.manual_seed(seed)
    model = fn()
    model.train()
    return model


def qwen3_moe(spec, seed=1234):
    return hm.qwen3_moe_model(spec, seed)


def llama(layers=3):
    cfg = transformers.LlamaConfig(vocab_size=256, hidden_size=96, intermediate_size=192, num_hidden_layers=layers,
                                   num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128)
    cfg._attn_implementation = "sdpa"
    return seeded(lambda: transformers.LlamaForCausalLM(cfg))


def llava(text_layers=2, vision_layers=2):
    text = dict(model_type="llama", vocab_size=256, hidden_size=64, intermediate_size=128,
                num_hidden_layers=text_layers, num_attention_heads=4, num_key_value_heads=2,
                max_position_embeddings=128)
    vision = dict(model_type="clip_vision_model", hidden_size=32, intermediate_size=64, num_hidden_layers=vision_layers,
                  num_attention_heads=2, image_size=32, patch_size=8, projection_dim=32)
    cfg = transformers.LlavaConfig(text_config=text, vision_config=vision, image_token_index=255,
                                   vision_feature_layer=-1)
    return seeded(lambda: transformers.LlavaForConditionalGeneration(cfg))


def gemma3n_text(layers=4, shared=2):
    cfg = transformers.Gemma3nTextConfig(vocab_size=256, vocab_size_per_layer_input=256, hidden_size=64,
                                         intermediate_size=128, num_hidden_layers=layers, num_attention_heads=4,
                                         num_key_value_heads=2, head_dim=16, num_kv_shared_layers=shared,
                                         laurel_rank=8, hidden_size_per_layer_input=16, altup_num_inputs=2,
                                         activation_sparsity_pattern=[0.0] * layers, max_position_embeddings=128)
    return seeded(lambda: transformers.Gemma3nForCausalLM(cfg))
