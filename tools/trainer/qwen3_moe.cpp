#include "tools/trainer/qwen3_moe.h"

#include <ATen/ATen.h>

namespace hpac::trainer {
namespace {

torch::nn::Linear linear(int64_t in, int64_t out) {
  return torch::nn::Linear(torch::nn::LinearOptions(in, out).bias(false));
}

}  // namespace

Qwen3MoeAttentionImpl::Qwen3MoeAttentionImpl(const ModelSpec& spec)
    : torch::nn::Module("Qwen3MoeAttention"),
      heads_(spec.num_attention_heads),
      kv_heads_(spec.num_key_value_heads),
      head_dim_(spec.head_dim) {
  q_proj = register_module("q_proj", linear(spec.hidden_size, heads_ * head_dim_));
  k_proj = register_module("k_proj", linear(spec.hidden_size, kv_heads_ * head_dim_));
  v_proj = register_module("v_proj", linear(spec.hidden_size, kv_heads_ * head_dim_));
  o_proj = register_module("o_proj", linear(heads_ * head_dim_, spec.hidden_size));
  q_norm = register_module("q_norm", RMSNorm(head_dim_, spec.rms_norm_eps));
  k_norm = register_module("k_norm", RMSNorm(head_dim_, spec.rms_norm_eps));
}

at::Tensor Qwen3MoeAttentionImpl::forward(const at::Tensor& x, const Rope& rope) {
  const int64_t b = x.size(0), s = x.size(1);
  auto heads = [&](const at::Tensor& t, int64_t n) { return t.view({b, s, n, head_dim_}); };
  at::Tensor q = q_norm(heads(q_proj(x), heads_)).transpose(1, 2);
  at::Tensor k = k_norm(heads(k_proj(x), kv_heads_)).transpose(1, 2);
  const at::Tensor v = heads(v_proj(x), kv_heads_).transpose(1, 2);
  q = applyRope(q, rope);
  k = applyRope(k, rope);
  return o_proj(eagerAttention(q, k, v, /*causal=*/true));
}

Qwen3MoeMLPImpl::Qwen3MoeMLPImpl(int64_t hidden, int64_t intermediate) : torch::nn::Module("Qwen3MoeMLP") {
  gate_proj = register_module("gate_proj", linear(hidden, intermediate));
  up_proj = register_module("up_proj", linear(hidden, intermediate));
  down_proj = register_module("down_proj", linear(intermediate, hidden));
}

at::Tensor Qwen3MoeMLPImpl::forward(const at::Tensor& x) {
  return down_proj(at::silu(gate_proj(x)) * up_proj(x));
}

Qwen3MoeSparseMoeBlockImpl::Qwen3MoeSparseMoeBlockImpl(const ModelSpec& spec)
    : torch::nn::Module("Qwen3MoeSparseMoeBlock"),
      num_experts_(spec.num_experts),
      top_k_(spec.num_experts_per_tok),
      norm_topk_prob_(spec.norm_topk_prob) {
  gate = register_module("gate", linear(spec.hidden_size, spec.num_experts));
  experts = register_module("experts", torch::nn::ModuleList());
  for (int64_t e = 0; e < num_experts_; ++e) {
    experts->push_back(Qwen3MoeMLP(spec.hidden_size, spec.moe_intermediate_size));
  }
}

at::Tensor Qwen3MoeSparseMoeBlockImpl::forward(const at::Tensor& x) {
  const int64_t h = x.size(-1);
  const at::Tensor flat = x.reshape({-1, h});
  const at::Tensor router_logits = gate(flat);
  at::Tensor routing_weights = at::softmax(router_logits, 1, at::kFloat);
  at::Tensor selected;
  std::tie(routing_weights, selected) = at::topk(routing_weights, top_k_, -1);
  if (norm_topk_prob_) routing_weights /= routing_weights.sum(-1, /*keepdim=*/true);  // in place, as HF
  routing_weights = routing_weights.to(x.scalar_type());

  at::Tensor out = at::zeros({flat.size(0), h}, x.options());
  // expert_mask [E, top_k, tokens]: which (slot, token) pairs each expert serves.
  const at::Tensor expert_mask = at::one_hot(selected, num_experts_).permute({2, 1, 0});
  const at::Tensor hit = at::nonzero(expert_mask.sum({-1, -2}) > 0).flatten();
  last_experts_hit_ = hit.numel();
  const auto hit_list = hit.accessor<int64_t, 1>();
  for (int64_t i = 0; i < hit.numel(); ++i) {
    const int64_t e = hit_list[i];
    const auto where = at::where(expert_mask[e]);
    const at::Tensor& slot = where[0];
    const at::Tensor& token = where[1];
    const at::Tensor state = flat.index_select(0, token);
    const at::Tensor weight = routing_weights.index({token, slot}).unsqueeze(-1);
    const at::Tensor y = experts->ptr<Qwen3MoeMLPImpl>(e)->forward(state) * weight;
    out.index_add_(0, token, y.to(out.scalar_type()));
  }
  return out.view(x.sizes());
}

Qwen3MoeDecoderLayerImpl::Qwen3MoeDecoderLayerImpl(const ModelSpec& spec) : CheckpointableLayer("Qwen3MoeDecoderLayer") {
  self_attn = register_module("self_attn", Qwen3MoeAttention(spec));
  mlp = register_module("mlp", Qwen3MoeSparseMoeBlock(spec));
  input_layernorm = register_module("input_layernorm", RMSNorm(spec.hidden_size, spec.rms_norm_eps));
  post_attention_layernorm = register_module("post_attention_layernorm", RMSNorm(spec.hidden_size, spec.rms_norm_eps));
}

at::Tensor Qwen3MoeDecoderLayerImpl::forward(const at::Tensor& x, const Rope& rope) {
  return runLayer({x}, [this, rope](const std::vector<at::Tensor>& in) {
    const at::Tensor& hidden = in[0];
    const at::Tensor normed = callSubmodule("input_layernorm", hidden, [this](const at::Tensor& t) { return input_layernorm(t); });
    const at::Tensor h =
        hidden + callSubmodule("self_attn", normed, [this, rope](const at::Tensor& t) { return self_attn(t, rope); });
    const at::Tensor normed2 =
        callSubmodule("post_attention_layernorm", h, [this](const at::Tensor& t) { return post_attention_layernorm(t); });
    return std::vector<at::Tensor>{h + callSubmodule("mlp", normed2, [this](const at::Tensor& t) { return mlp(t); })};
  })[0];
}

Qwen3MoeModelImpl::Qwen3MoeModelImpl(const ModelSpec& spec) : torch::nn::Module("Qwen3MoeModel"), spec_(spec) {
  embed_tokens = register_module("embed_tokens", torch::nn::Embedding(spec.vocab_size, spec.hidden_size));
  layers = register_module("layers", torch::nn::ModuleList());
  for (int64_t l = 0; l < spec.num_layers; ++l) layers->push_back(Qwen3MoeDecoderLayer(spec));
  norm = register_module("norm", RMSNorm(spec.hidden_size, spec.rms_norm_eps));
}

at::Tensor Qwen3MoeModelImpl::forward(const at::Tensor& inputs_embeds) {
  const Rope rope = ropeTables(inputs_embeds.size(1), spec_.head_dim, spec_.rope_theta, inputs_embeds.scalar_type());
  at::Tensor h = inputs_embeds;
  for (const auto& layer : *layers) h = layer->as<Qwen3MoeDecoderLayerImpl>()->forward(h, rope);
  return norm(h);
}

Qwen3MoeForCausalLM::Qwen3MoeForCausalLM(const ModelSpec& spec) : ZooModel("Qwen3MoeForCausalLM") {
  config_.model_type = "qwen3_moe";
  model = register_module("model", Qwen3MoeModel(spec));
  lm_head = register_module("lm_head", linear(spec.hidden_size, spec.vocab_size));
}

at::Tensor Qwen3MoeForCausalLM::logits(const at::Tensor& tokens) {
  const at::Tensor embeds = keepInputEmbeds(model->embed_tokens(tokens));
  return lm_head(model->forward(embeds));
}

at::Tensor Qwen3MoeForCausalLM::loss(const at::Tensor& tokens) { return nextTokenLoss(logits(tokens), tokens); }

}  // namespace hpac::trainer
