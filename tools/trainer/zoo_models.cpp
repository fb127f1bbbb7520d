#include "tools/trainer/zoo_models.h"

#include <ATen/ATen.h>

#include <string>

namespace hpac::trainer {
namespace {

torch::nn::Linear linear(int64_t in, int64_t out, bool bias) {
  return torch::nn::Linear(torch::nn::LinearOptions(in, out).bias(bias));
}

torch::nn::LayerNorm layerNorm(int64_t dim) {
  return torch::nn::LayerNorm(torch::nn::LayerNormOptions({dim}).eps(1e-5));
}

std::shared_ptr<torch::nn::Module> container(torch::nn::Module& parent, const std::string& name,
                                             const std::string& class_name) {
  return parent.register_module(name, std::make_shared<torch::nn::Module>(class_name));
}

// [B, S, H*D] -> [B, H, S, D]
at::Tensor splitHeads(const at::Tensor& t, int64_t heads) {
  return t.view({t.size(0), t.size(1), heads, -1}).transpose(1, 2);
}

}  // namespace

// ---- GPT-2 ----------------------------------------------------------------
GPT2AttentionImpl::GPT2AttentionImpl(const ModelSpec& spec)
    : torch::nn::Module("GPT2Attention"), heads_(spec.num_attention_heads) {
  c_attn = register_module("c_attn", linear(spec.hidden_size, 3 * spec.hidden_size, true));
  c_proj = register_module("c_proj", linear(spec.hidden_size, spec.hidden_size, true));
}

at::Tensor GPT2AttentionImpl::forward(const at::Tensor& x) {
  const auto qkv = c_attn(x).chunk(3, -1);
  return c_proj(eagerAttention(splitHeads(qkv[0], heads_), splitHeads(qkv[1], heads_), splitHeads(qkv[2], heads_),
                               /*causal=*/true));
}

GPT2MLPImpl::GPT2MLPImpl(const ModelSpec& spec) : torch::nn::Module("GPT2MLP") {
  c_fc = register_module("c_fc", linear(spec.hidden_size, spec.intermediate_size, true));
  c_proj = register_module("c_proj", linear(spec.intermediate_size, spec.hidden_size, true));
}

at::Tensor GPT2MLPImpl::forward(const at::Tensor& x) { return c_proj(geluTanh(c_fc(x))); }

GPT2BlockImpl::GPT2BlockImpl(const ModelSpec& spec) : CheckpointableLayer("GPT2Block") {
  ln_1 = register_module("ln_1", layerNorm(spec.hidden_size));
  attn = register_module("attn", GPT2Attention(spec));
  ln_2 = register_module("ln_2", layerNorm(spec.hidden_size));
  mlp = register_module("mlp", GPT2MLP(spec));
}

at::Tensor GPT2BlockImpl::forward(const at::Tensor& x) {
  return runLayer({x}, [this](const std::vector<at::Tensor>& in) {
    const at::Tensor h = in[0] + callSubmodule("attn", ln_1(in[0]), [this](const at::Tensor& t) { return attn(t); });
    return std::vector<at::Tensor>{h + callSubmodule("mlp", ln_2(h), [this](const at::Tensor& t) { return mlp(t); })};
  })[0];
}

GPT2ModelImpl::GPT2ModelImpl(const ModelSpec& spec) : torch::nn::Module("GPT2Model") {
  wte = register_module("wte", torch::nn::Embedding(spec.vocab_size, spec.hidden_size));
  wpe = register_module("wpe", torch::nn::Embedding(4096, spec.hidden_size));
  h = register_module("h", torch::nn::ModuleList());
  for (int64_t l = 0; l < spec.num_layers; ++l) h->push_back(GPT2Block(spec));
  ln_f = register_module("ln_f", layerNorm(spec.hidden_size));
}

at::Tensor GPT2ModelImpl::forward(const at::Tensor& inputs_embeds) {
  at::Tensor x = inputs_embeds + wpe(at::arange(inputs_embeds.size(1), at::kLong));
  for (const auto& block : *h) x = block->as<GPT2BlockImpl>()->forward(x);
  return ln_f(x);
}

GPT2LMHeadModel::GPT2LMHeadModel(const ModelSpec& spec) : ZooModel("GPT2LMHeadModel") {
  config_.model_type = "gpt2";
  transformer = register_module("transformer", GPT2Model(spec));
  lm_head = register_module("lm_head", linear(spec.hidden_size, spec.vocab_size, false));
}

at::Tensor GPT2LMHeadModel::hidden(const at::Tensor& tokens) {
  return transformer->forward(keepInputEmbeds(transformer->wte(tokens)));
}

at::Tensor GPT2LMHeadModel::loss(const at::Tensor& tokens) { return nextTokenLoss(lm_head(hidden(tokens)), tokens); }

// ---- Pipeline stage ---------------------------------------------------------
PipelineStageModel::PipelineStageModel(const ModelSpec& spec) : ZooModel("Qwen3MoePipelineStage"), spec_(spec) {
  config_.model_type = "qwen3_moe";
  model = container(*this, "model", "Qwen3MoeStageModel");
  embed_tokens = model->register_module("embed_tokens", torch::nn::Embedding(spec.vocab_size, spec.hidden_size));
  layers = model->register_module("layers", torch::nn::ModuleDict());
  for (int64_t l = spec.num_layers / 2; l < spec.num_layers; ++l) {
    layers->update({{std::to_string(l), Qwen3MoeDecoderLayer(spec).ptr()}});
  }
  norm = model->register_module("norm", RMSNorm(spec.hidden_size, spec.rms_norm_eps));
  lm_head = register_module("lm_head", linear(spec.hidden_size, spec.vocab_size, false));
}

at::Tensor PipelineStageModel::loss(const at::Tensor& tokens) {
  at::Tensor h = keepInputEmbeds(embed_tokens(tokens));
  const Rope rope = ropeTables(h.size(1), spec_.head_dim, spec_.rope_theta, h.scalar_type());
  for (const auto& item : layers->items()) h = item.second->as<Qwen3MoeDecoderLayerImpl>()->forward(h, rope);
  return nextTokenLoss(lm_head(norm(h)), tokens);
}

// ---- Dense decoder layer with KV sharing ------------------------------------
DenseAttentionImpl::DenseAttentionImpl(const ModelSpec& spec, int64_t layer_index, int64_t kv_source)
    : torch::nn::Module("DenseAttention"),
      heads_(spec.num_attention_heads),
      kv_heads_(spec.num_key_value_heads),
      head_dim_(spec.head_dim),
      layer_index_(layer_index),
      kv_source_(kv_source) {
  q_proj = register_module("q_proj", linear(spec.hidden_size, heads_ * head_dim_, false));
  k_proj = register_module("k_proj", linear(spec.hidden_size, kv_heads_ * head_dim_, false));
  v_proj = register_module("v_proj", linear(spec.hidden_size, kv_heads_ * head_dim_, false));
  o_proj = register_module("o_proj", linear(heads_ * head_dim_, spec.hidden_size, false));
}

at::Tensor DenseAttentionImpl::forward(const at::Tensor& x, const Rope& rope, KvCache* cache) {
  const at::Tensor q = applyRope(splitHeads(q_proj(x), heads_), rope);
  at::Tensor k, v;
  if (kv_source_ >= 0) {
    // Cross-layer KV sharing goes through the cache, as in Gemma 3n.
    TORCH_CHECK(cache != nullptr && cache->enabled && cache->kv.count(kv_source_), "layer ", layer_index_,
                " shares the K/V of layer ", kv_source_,
                " through the cache, but use_cache is false; KV-sharing models must keep use_cache");
    std::tie(k, v) = cache->kv.at(kv_source_);
  } else {
    k = applyRope(splitHeads(k_proj(x), kv_heads_), rope);
    v = splitHeads(v_proj(x), kv_heads_);
    if (cache != nullptr && cache->enabled) cache->kv[layer_index_] = {k, v};
  }
  return o_proj(eagerAttention(q, k, v, /*causal=*/true));
}

DenseDecoderLayerImpl::DenseDecoderLayerImpl(const std::string& class_name, const ModelSpec& spec,
                                             int64_t layer_index, int64_t kv_source)
    : CheckpointableLayer(class_name) {
  self_attn = register_module("self_attn", DenseAttention(spec, layer_index, kv_source));
  mlp = register_module("mlp", Qwen3MoeMLP(spec.hidden_size, spec.intermediate_size));
  input_layernorm = register_module("input_layernorm", RMSNorm(spec.hidden_size, spec.rms_norm_eps));
  post_attention_layernorm = register_module("post_attention_layernorm", RMSNorm(spec.hidden_size, spec.rms_norm_eps));
}

at::Tensor DenseDecoderLayerImpl::forward(const at::Tensor& x, const Rope& rope, KvCache* cache) {
  return runLayer({x}, [this, rope, cache](const std::vector<at::Tensor>& in) {
    const at::Tensor normed =
        callSubmodule("input_layernorm", in[0], [this](const at::Tensor& t) { return input_layernorm(t); });
    const at::Tensor h =
        in[0] + callSubmodule("self_attn", normed, [this, rope, cache](const at::Tensor& t) { return self_attn(t, rope, cache); });
    const at::Tensor normed2 =
        callSubmodule("post_attention_layernorm", h, [this](const at::Tensor& t) { return post_attention_layernorm(t); });
    return std::vector<at::Tensor>{h + callSubmodule("mlp", normed2, [this](const at::Tensor& t) { return mlp(t); })};
  })[0];
}

TextModelImpl::TextModelImpl(const std::string& layer_class, const ModelSpec& spec, int64_t num_kv_shared_layers)
    : torch::nn::Module("TextModel"), spec_(spec) {
  embed_tokens = register_module("embed_tokens", torch::nn::Embedding(spec.vocab_size, spec.hidden_size));
  layers = register_module("layers", torch::nn::ModuleList());
  const int64_t first_shared = spec.num_layers - num_kv_shared_layers;
  for (int64_t l = 0; l < spec.num_layers; ++l) {
    const int64_t source = (num_kv_shared_layers > 0 && l >= first_shared) ? first_shared - 1 : -1;
    layers->push_back(DenseDecoderLayer(layer_class, spec, l, source));
  }
  norm = register_module("norm", RMSNorm(spec.hidden_size, spec.rms_norm_eps));
}

at::Tensor TextModelImpl::forward(const at::Tensor& inputs_embeds, KvCache* cache) {
  const Rope rope = ropeTables(inputs_embeds.size(1), spec_.head_dim, spec_.rope_theta, inputs_embeds.scalar_type());
  at::Tensor h = inputs_embeds;
  for (const auto& layer : *layers) h = layer->as<DenseDecoderLayerImpl>()->forward(h, rope, cache);
  return norm(h);
}

// ---- LLaVA-style two towers --------------------------------------------------
SiglipAttentionImpl::SiglipAttentionImpl(const ModelSpec& spec)
    : torch::nn::Module("SiglipAttention"), heads_(spec.num_attention_heads) {
  q_proj = register_module("q_proj", linear(spec.hidden_size, spec.hidden_size, true));
  k_proj = register_module("k_proj", linear(spec.hidden_size, spec.hidden_size, true));
  v_proj = register_module("v_proj", linear(spec.hidden_size, spec.hidden_size, true));
  out_proj = register_module("out_proj", linear(spec.hidden_size, spec.hidden_size, true));
}

at::Tensor SiglipAttentionImpl::forward(const at::Tensor& x) {
  return out_proj(eagerAttention(splitHeads(q_proj(x), heads_), splitHeads(k_proj(x), heads_),
                                 splitHeads(v_proj(x), heads_), /*causal=*/false));
}

SiglipMLPImpl::SiglipMLPImpl(const ModelSpec& spec) : torch::nn::Module("SiglipMLP") {
  fc1 = register_module("fc1", linear(spec.hidden_size, spec.intermediate_size, true));
  fc2 = register_module("fc2", linear(spec.intermediate_size, spec.hidden_size, true));
}

at::Tensor SiglipMLPImpl::forward(const at::Tensor& x) { return fc2(geluTanh(fc1(x))); }

SiglipEncoderLayerImpl::SiglipEncoderLayerImpl(const ModelSpec& spec) : CheckpointableLayer("SiglipEncoderLayer") {
  layer_norm1 = register_module("layer_norm1", layerNorm(spec.hidden_size));
  self_attn = register_module("self_attn", SiglipAttention(spec));
  layer_norm2 = register_module("layer_norm2", layerNorm(spec.hidden_size));
  mlp = register_module("mlp", SiglipMLP(spec));
}

at::Tensor SiglipEncoderLayerImpl::forward(const at::Tensor& x) {
  return runLayer({x}, [this](const std::vector<at::Tensor>& in) {
    const at::Tensor n1 = callSubmodule("layer_norm1", in[0], [this](const at::Tensor& t) { return layer_norm1(t); });
    const at::Tensor h = in[0] + callSubmodule("self_attn", n1, [this](const at::Tensor& t) { return self_attn(t); });
    const at::Tensor n2 = callSubmodule("layer_norm2", h, [this](const at::Tensor& t) { return layer_norm2(t); });
    return std::vector<at::Tensor>{h + callSubmodule("mlp", n2, [this](const at::Tensor& t) { return mlp(t); })};
  })[0];
}

LlavaForConditionalGeneration::LlavaForConditionalGeneration(const ModelSpec& spec)
    : ZooModel("LlavaForConditionalGeneration") {
  config_.model_type = "llava";
  config_.sub_configs["text_config"] = std::make_shared<ModelConfig>();
  config_.sub_configs["vision_config"] = std::make_shared<ModelConfig>();
  model = container(*this, "model", "LlavaModel");
  auto vision_tower = container(*model, "vision_tower", "SiglipVisionModel");
  auto vision_model = container(*vision_tower, "vision_model", "SiglipVisionTransformer");
  auto embeddings = container(*vision_model, "embeddings", "SiglipVisionEmbeddings");
  patch_embedding = embeddings->register_module("patch_embedding", linear(kPatchDim, spec.hidden_size, true));
  auto encoder = container(*vision_model, "encoder", "SiglipEncoder");
  vision_layers = encoder->register_module("layers", torch::nn::ModuleList());
  for (int64_t l = 0; l < spec.num_layers; ++l) vision_layers->push_back(SiglipEncoderLayer(spec));
  post_layernorm = vision_model->register_module("post_layernorm", layerNorm(spec.hidden_size));
  auto projector = container(*model, "multi_modal_projector", "LlavaMultiModalProjector");
  linear_1 = projector->register_module("linear_1", linear(spec.hidden_size, spec.hidden_size, true));
  linear_2 = projector->register_module("linear_2", linear(spec.hidden_size, spec.hidden_size, true));
  language_model = model->register_module("language_model", TextModel("LlamaDecoderLayer", spec, 0));
  lm_head = register_module("lm_head", linear(spec.hidden_size, spec.vocab_size, false));
}

at::Tensor LlavaForConditionalGeneration::loss(const at::Tensor& tokens) {
  const int64_t b = tokens.size(0);
  // A fixed synthetic image: deterministic patches.
  const at::Tensor pixels =
      at::sin(at::arange(kPatches * kPatchDim, at::kFloat) * 0.37).view({1, kPatches, kPatchDim}).expand({b, -1, -1});
  at::Tensor v = patch_embedding(pixels.to(patch_embedding->weight.scalar_type()));
  for (const auto& layer : *vision_layers) v = layer->as<SiglipEncoderLayerImpl>()->forward(v);
  const at::Tensor image = linear_2(geluTanh(linear_1(post_layernorm(v))));
  const at::Tensor text = keepInputEmbeds(language_model->embed_tokens(tokens));
  const at::Tensor h = language_model->forward(at::cat({image, text}, 1), nullptr);
  return nextTokenLoss(lm_head(h.narrow(1, kPatches, tokens.size(1))), tokens);
}

// ---- Gemma3n-style KV sharing ------------------------------------------------
Gemma3nForConditionalGeneration::Gemma3nForConditionalGeneration(const ModelSpec& spec)
    : ZooModel("Gemma3nForConditionalGeneration") {
  config_.model_type = "gemma3n";
  auto text = std::make_shared<ModelConfig>();
  text->num_kv_shared_layers = spec.num_kv_shared_layers;
  config_.sub_configs["text_config"] = text;
  config_.sub_configs["vision_config"] = std::make_shared<ModelConfig>();
  model = container(*this, "model", "Gemma3nModel");
  language_model = model->register_module("language_model",
                                          TextModel("Gemma3nTextDecoderLayer", spec, spec.num_kv_shared_layers));
  lm_head = register_module("lm_head", linear(spec.hidden_size, spec.vocab_size, false));
}

at::Tensor Gemma3nForConditionalGeneration::loss(const at::Tensor& tokens) {
  KvCache cache;
  cache.enabled = config_.sub_configs.at("text_config")->use_cache;
  const at::Tensor embeds = keepInputEmbeds(language_model->embed_tokens(tokens));
  return nextTokenLoss(lm_head(language_model->forward(embeds, &cache)), tokens);
}

// ---- Retrieval wrapper ------------------------------------------------------
BiEncoderModel::BiEncoderModel(const ModelSpec& spec) : ZooModel("BiEncoderModel") {
  config_.model_type = "bi_encoder";
  encoder = register_module("encoder", std::make_shared<GPT2LMHeadModel>(spec));
}

at::Tensor BiEncoderModel::loss(const at::Tensor& tokens) {
  const int64_t half = tokens.size(1) / 2;
  const at::Tensor hidden = encoder->hidden(tokens);
  last_input_embeds_ = encoder->lastInputEmbeds();
  auto pool = [&](int64_t start, int64_t len) {
    const at::Tensor m = hidden.narrow(1, start, len).mean(1);
    return m / m.norm(2, -1, /*keepdim=*/true).clamp_min(1e-6);
  };
  const at::Tensor query = pool(0, half), doc = pool(half, tokens.size(1) - half);
  const at::Tensor sim = at::matmul(query, doc.t()) / 0.05;
  const at::Tensor labels = at::arange(tokens.size(0), at::kLong);
  return at::cross_entropy_loss(sim.to(at::kFloat), labels) +
         nextTokenLoss(encoder->lm_head(hidden), tokens);
}

// ---- Layers outside the alias lists -------------------------------------------
CustomBlockImpl::CustomBlockImpl(const ModelSpec& spec) : CheckpointableLayer("CustomBlock") {
  pre_mix_norm = register_module("pre_mix_norm", RMSNorm(spec.hidden_size, spec.rms_norm_eps));
  token_mixer = register_module("token_mixer", Qwen3MoeAttention(spec));
  pre_channel_norm = register_module("pre_channel_norm", RMSNorm(spec.hidden_size, spec.rms_norm_eps));
  channel_mixer = register_module("channel_mixer", Qwen3MoeMLP(spec.hidden_size, spec.intermediate_size));
}

at::Tensor CustomBlockImpl::forward(const at::Tensor& x, const Rope& rope) {
  return runLayer({x}, [this, rope](const std::vector<at::Tensor>& in) {
    const at::Tensor h = in[0] + callSubmodule("token_mixer", pre_mix_norm(in[0]),
                                               [this, rope](const at::Tensor& t) { return token_mixer(t, rope); });
    return std::vector<at::Tensor>{
        h + callSubmodule("channel_mixer", pre_channel_norm(h), [this](const at::Tensor& t) { return channel_mixer(t); })};
  })[0];
}

CustomBlocksModel::CustomBlocksModel(const ModelSpec& spec) : ZooModel("CustomBlocksModel"), spec_(spec) {
  config_.model_type = "custom_blocks";
  embed = register_module("embed", torch::nn::Embedding(spec.vocab_size, spec.hidden_size));
  backbone = container(*this, "backbone", "CustomBackbone");
  blocks = backbone->register_module("blocks", torch::nn::ModuleList());
  for (int64_t l = 0; l < spec.num_layers; ++l) blocks->push_back(CustomBlock(spec));
  heads = register_module("heads", torch::nn::ModuleDict());
  heads->update({{"lm", linear(spec.hidden_size, spec.vocab_size, false).ptr()}});
  for (const char* aux : {"aux_a", "aux_b", "aux_c", "aux_d", "aux_e"}) {
    heads->update({{aux, linear(spec.hidden_size, 2, false).ptr()}});
  }
}

at::Tensor CustomBlocksModel::loss(const at::Tensor& tokens) {
  at::Tensor h = keepInputEmbeds(embed(tokens));
  const Rope rope = ropeTables(h.size(1), spec_.head_dim, spec_.rope_theta, h.scalar_type());
  for (const auto& block : *blocks) h = block->as<CustomBlockImpl>()->forward(h, rope);
  return nextTokenLoss(heads["lm"]->as<torch::nn::LinearImpl>()->forward(h), tokens);
}

}  // namespace hpac::trainer
