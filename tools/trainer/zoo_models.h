// hpac/tools/trainer/zoo_models.h
//
// The rest of the model zoo: one tiny model per shape that container
// discovery and routing must handle (docs/trainer.md, "Model zoo").
//   GPT2LMHeadModel        layers under transformer.h (registered, GPT-2)
//   PipelineStageModel     a pipeline stage: layers in a numeric-key ModuleDict
//                          model.layers {"2", "3"} (not registered)
//   LlavaForConditionalGeneration
//                          two towers: model.vision_tower.vision_model.encoder.layers
//                          and model.language_model.layers (registered by class name)
//   Gemma3nForConditionalGeneration
//                          cross-layer KV sharing (config.text_config.num_kv_shared_layers):
//                          the last N layers attend with the K/V the last
//                          non-shared layer put in the cache (registered)
//   BiEncoderModel         a retrieval wrapper around an inner GPT-2 (`encoder`)
//   CustomBlocksModel      layers under backbone.blocks whose submodules use
//                          names outside the alias lists; no native checkpoint
#pragma once

#include "tools/trainer/checkpointable.h"
#include "tools/trainer/qwen3_moe.h"
#include "tools/trainer/zoo_common.h"

#include <torch/nn/modules/container/moduledict.h>
#include <torch/nn/modules/container/modulelist.h>
#include <torch/nn/modules/embedding.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/modules/normalization.h>

#include <map>
#include <utility>

namespace hpac::trainer {

// ---- GPT-2 ----------------------------------------------------------------
class GPT2AttentionImpl : public torch::nn::Module {
 public:
  explicit GPT2AttentionImpl(const ModelSpec& spec);
  at::Tensor forward(const at::Tensor& x);
  torch::nn::Linear c_attn{nullptr}, c_proj{nullptr};

 private:
  int64_t heads_;
};
TORCH_MODULE(GPT2Attention);

class GPT2MLPImpl : public torch::nn::Module {
 public:
  explicit GPT2MLPImpl(const ModelSpec& spec);
  at::Tensor forward(const at::Tensor& x);
  torch::nn::Linear c_fc{nullptr}, c_proj{nullptr};
};
TORCH_MODULE(GPT2MLP);

class GPT2BlockImpl : public CheckpointableLayer {
 public:
  explicit GPT2BlockImpl(const ModelSpec& spec);
  at::Tensor forward(const at::Tensor& x);
  torch::nn::LayerNorm ln_1{nullptr}, ln_2{nullptr};
  GPT2Attention attn{nullptr};
  GPT2MLP mlp{nullptr};
};
TORCH_MODULE(GPT2Block);

class GPT2ModelImpl : public torch::nn::Module {
 public:
  explicit GPT2ModelImpl(const ModelSpec& spec);
  at::Tensor forward(const at::Tensor& inputs_embeds);  // adds positions, runs h, ln_f
  torch::nn::Embedding wte{nullptr}, wpe{nullptr};
  torch::nn::ModuleList h{nullptr};
  torch::nn::LayerNorm ln_f{nullptr};
};
TORCH_MODULE(GPT2Model);

class GPT2LMHeadModel : public ZooModel {
 public:
  explicit GPT2LMHeadModel(const ModelSpec& spec);
  at::Tensor loss(const at::Tensor& tokens) override;
  at::Tensor hidden(const at::Tensor& tokens);  // [B, S, H]
  GPT2Model transformer{nullptr};
  torch::nn::Linear lm_head{nullptr};
};

// ---- Pipeline stage (numeric-key ModuleDict) -------------------------------
class PipelineStageModel : public ZooModel {
 public:
  // Holds Qwen3-MoE layers num_layers/2 .. num_layers-1 under their global indices.
  explicit PipelineStageModel(const ModelSpec& spec);
  at::Tensor loss(const at::Tensor& tokens) override;
  std::shared_ptr<torch::nn::Module> model;  // embed_tokens, layers (ModuleDict), norm
  torch::nn::Embedding embed_tokens{nullptr};
  torch::nn::ModuleDict layers{nullptr};
  RMSNorm norm{nullptr};
  torch::nn::Linear lm_head{nullptr};

 private:
  ModelSpec spec_;
};

// ---- Dense decoder layer with optional cross-layer KV sharing --------------
// The cache of one forward: K/V of the layers that publish theirs.
struct KvCache {
  bool enabled = false;
  std::map<int64_t, std::pair<at::Tensor, at::Tensor>> kv;
};

class DenseAttentionImpl : public torch::nn::Module {
 public:
  // kv_source >= 0: this layer reuses that layer's K/V from the cache.
  DenseAttentionImpl(const ModelSpec& spec, int64_t layer_index, int64_t kv_source);
  at::Tensor forward(const at::Tensor& x, const Rope& rope, KvCache* cache);
  torch::nn::Linear q_proj{nullptr}, k_proj{nullptr}, v_proj{nullptr}, o_proj{nullptr};

 private:
  int64_t heads_, kv_heads_, head_dim_, layer_index_, kv_source_;
};
TORCH_MODULE(DenseAttention);

class DenseDecoderLayerImpl : public CheckpointableLayer {
 public:
  DenseDecoderLayerImpl(const std::string& class_name, const ModelSpec& spec, int64_t layer_index,
                        int64_t kv_source = -1);
  at::Tensor forward(const at::Tensor& x, const Rope& rope, KvCache* cache = nullptr);
  DenseAttention self_attn{nullptr};
  Qwen3MoeMLP mlp{nullptr};
  RMSNorm input_layernorm{nullptr}, post_attention_layernorm{nullptr};
};
TORCH_MODULE(DenseDecoderLayer);

// The language tower of the multimodal zoo models: embed_tokens, layers, norm.
class TextModelImpl : public torch::nn::Module {
 public:
  TextModelImpl(const std::string& layer_class, const ModelSpec& spec, int64_t num_kv_shared_layers);
  at::Tensor forward(const at::Tensor& inputs_embeds, KvCache* cache);
  torch::nn::Embedding embed_tokens{nullptr};
  torch::nn::ModuleList layers{nullptr};
  RMSNorm norm{nullptr};

 private:
  ModelSpec spec_;
};
TORCH_MODULE(TextModel);

// ---- LLaVA-style two-tower model --------------------------------------------
class SiglipAttentionImpl : public torch::nn::Module {
 public:
  explicit SiglipAttentionImpl(const ModelSpec& spec);
  at::Tensor forward(const at::Tensor& x);
  torch::nn::Linear q_proj{nullptr}, k_proj{nullptr}, v_proj{nullptr}, out_proj{nullptr};

 private:
  int64_t heads_;
};
TORCH_MODULE(SiglipAttention);

class SiglipMLPImpl : public torch::nn::Module {
 public:
  explicit SiglipMLPImpl(const ModelSpec& spec);
  at::Tensor forward(const at::Tensor& x);
  torch::nn::Linear fc1{nullptr}, fc2{nullptr};
};
TORCH_MODULE(SiglipMLP);

class SiglipEncoderLayerImpl : public CheckpointableLayer {
 public:
  explicit SiglipEncoderLayerImpl(const ModelSpec& spec);
  at::Tensor forward(const at::Tensor& x);
  torch::nn::LayerNorm layer_norm1{nullptr}, layer_norm2{nullptr};
  SiglipAttention self_attn{nullptr};
  SiglipMLP mlp{nullptr};
};
TORCH_MODULE(SiglipEncoderLayer);

class LlavaForConditionalGeneration : public ZooModel {
 public:
  static constexpr int64_t kPatches = 8, kPatchDim = 48;
  explicit LlavaForConditionalGeneration(const ModelSpec& spec);
  // Language-model loss on the text tokens, conditioned on a fixed synthetic image.
  at::Tensor loss(const at::Tensor& tokens) override;
  std::shared_ptr<torch::nn::Module> model;  // vision_tower, multi_modal_projector, language_model
  torch::nn::Linear patch_embedding{nullptr}, linear_1{nullptr}, linear_2{nullptr};
  torch::nn::ModuleList vision_layers{nullptr};
  torch::nn::LayerNorm post_layernorm{nullptr};
  TextModel language_model{nullptr};
  torch::nn::Linear lm_head{nullptr};
};

// ---- Gemma3n-style KV sharing ------------------------------------------------
class Gemma3nForConditionalGeneration : public ZooModel {
 public:
  explicit Gemma3nForConditionalGeneration(const ModelSpec& spec);
  at::Tensor loss(const at::Tensor& tokens) override;
  std::shared_ptr<torch::nn::Module> model;  // language_model
  TextModel language_model{nullptr};
  torch::nn::Linear lm_head{nullptr};
};

// ---- Retrieval wrapper ------------------------------------------------------
class BiEncoderModel : public ZooModel {
 public:
  explicit BiEncoderModel(const ModelSpec& spec);
  bool supportsGradientCheckpointing() const override { return encoder->supportsGradientCheckpointing(); }
  // Contrastive loss between the mean-pooled first and second halves of each
  // sequence (in-batch negatives), plus the encoder's LM loss.
  at::Tensor loss(const at::Tensor& tokens) override;
  std::shared_ptr<GPT2LMHeadModel> encoder;
};

// ---- Layers with names outside the alias lists ------------------------------
class CustomBlockImpl : public CheckpointableLayer {
 public:
  explicit CustomBlockImpl(const ModelSpec& spec);
  at::Tensor forward(const at::Tensor& x, const Rope& rope);
  RMSNorm pre_mix_norm{nullptr}, pre_channel_norm{nullptr};
  Qwen3MoeAttention token_mixer{nullptr};
  Qwen3MoeMLP channel_mixer{nullptr};
};
TORCH_MODULE(CustomBlock);

class CustomBlocksModel : public ZooModel {
 public:
  explicit CustomBlocksModel(const ModelSpec& spec);
  bool supportsGradientCheckpointing() const override { return false; }
  at::Tensor loss(const at::Tensor& tokens) override;
  torch::nn::Embedding embed{nullptr};
  std::shared_ptr<torch::nn::Module> backbone;  // blocks
  torch::nn::ModuleList blocks{nullptr};
  torch::nn::ModuleDict heads{nullptr};  // non-numeric keys: never a layer container

 private:
  ModelSpec spec_;
};

}  // namespace hpac::trainer
