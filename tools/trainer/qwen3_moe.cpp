#include "tools/trainer/qwen3_moe.h"

#include "tools/distributed/parallel_ops.h"
#include "tools/trainer/parallel.h"

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
  if (par_) return forwardParallel(x, rope);
  const int64_t b = x.size(0), s = x.size(1);
  auto heads = [&](const at::Tensor& t, int64_t n) { return t.view({b, s, n, head_dim_}); };
  at::Tensor q = q_norm(heads(q_proj(x), heads_)).transpose(1, 2);
  at::Tensor k = k_norm(heads(k_proj(x), kv_heads_)).transpose(1, 2);
  const at::Tensor v = heads(v_proj(x), kv_heads_).transpose(1, 2);
  q = applyRope(q, rope);
  k = applyRope(k, rope);
  return o_proj(eagerAttention(q, k, v, /*causal=*/true));
}

at::Tensor Qwen3MoeAttentionImpl::forwardParallel(const at::Tensor& x, const Rope& rope) {
  const ParallelRuntime& rt = *par_;
  const int64_t b = x.size(0), s = x.size(1), hidden = x.size(2);
  const int64_t heads = heads_ / rt.spec.tp, kv_heads = kv_heads_ / rt.spec.tp;
  auto weight = [&](const torch::nn::Linear& proj, std::vector<int64_t> shape) {
    return rt.spec.fsdp ? dist::fsdpGather(proj->weight, rt.dp_pg, shape) : proj->weight;
  };
  auto split = [&](const at::Tensor& t, int64_t n) { return t.view({b, s, n, head_dim_}); };
  // Forward identity, backward all-reduce: every TP rank's heads contribute to x's gradient.
  const at::Tensor in = dist::copyToTensorParallel(x, rt.tp_pg);
  at::Tensor q = q_norm(split(at::linear(in, weight(q_proj, {heads * head_dim_, hidden})), heads)).transpose(1, 2);
  at::Tensor k = k_norm(split(at::linear(in, weight(k_proj, {kv_heads * head_dim_, hidden})), kv_heads)).transpose(1, 2);
  const at::Tensor v = split(at::linear(in, weight(v_proj, {kv_heads * head_dim_, hidden})), kv_heads).transpose(1, 2);
  q = applyRope(q, rope);
  k = applyRope(k, rope);
  const at::Tensor partial = at::linear(eagerAttention(q, k, v, /*causal=*/true), weight(o_proj, {hidden, heads * head_dim_}));
  return dist::reduceFromTensorParallel(partial, rt.tp_pg);
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

TopKRouting Qwen3MoeSparseMoeBlockImpl::route(const at::Tensor& flat) {
  return routeTopK(gate(flat), top_k_, norm_topk_prob_, flat.scalar_type());
}

at::Tensor Qwen3MoeSparseMoeBlockImpl::forward(const at::Tensor& x) {
  if (par_) return forwardParallel(x);
  const at::Tensor flat = x.reshape({-1, x.size(-1)});
  const TopKRouting routing = route(flat);
  at::Tensor out = at::zeros_like(flat);
  last_experts_hit_ = 0;
  for (int64_t e = 0; e < num_experts_; ++e) {
    const ExpertTokens hit = tokensFor(routing, e);
    if (hit.empty()) continue;  // only the experts actually hit run, as in HF
    ++last_experts_hit_;
    const at::Tensor y = experts->ptr<Qwen3MoeMLPImpl>(e)->forward(flat.index_select(0, hit.token)) * hit.weight;
    out.index_add_(0, hit.token, y.to(out.scalar_type()));
  }
  return out.view(x.sizes());
}

// The router runs on every rank over its own tokens (replicated weights).
// The (token, slot) pairs are sorted by expert, so the rows bound for each EP
// rank, and for each expert within them, are contiguous. Counts travel first
// (a table per destination: rows per local expert), then the rows; the
// receiver groups what it got by expert, runs its experts (each TP rank its
// slice of their width; one all-reduce sums the slices) and sends the results
// back in the order they came. Every collective is issued on every rank of
// its group whatever the routing, empty chunks are skipped symmetrically.
at::Tensor Qwen3MoeSparseMoeBlockImpl::forwardParallel(const at::Tensor& x) {
  const ParallelRuntime& rt = *par_;
  const int64_t h = x.size(-1), ep = rt.spec.ep, local = rt.localExperts();
  const at::Tensor flat = x.reshape({-1, h});
  const ExpertOrder sorted = sortByExpert(route(flat), num_experts_);
  const at::Tensor& token = sorted.token;
  const at::Tensor& per_expert = sorted.per_expert;
  const at::Tensor table = dist::exchangeCounts(per_expert.view({ep, local}).contiguous(), rt.ep_pg);
  const auto sent = per_expert.accessor<int64_t, 1>();
  const auto got = table.accessor<int64_t, 2>();  // got[src][j]: rows from src for my expert j
  std::vector<int64_t> send_counts(ep, 0), recv_counts(ep, 0), src_offset(ep + 1, 0), expert_rows(local, 0);
  for (int64_t r = 0; r < ep; ++r) {
    for (int64_t j = 0; j < local; ++j) {
      send_counts[r] += sent[r * local + j];
      recv_counts[r] += got[r][j];
    }
    src_offset[r + 1] = src_offset[r] + recv_counts[r];
  }
  const at::Tensor received = dist::allToAll(flat.index_select(0, token), send_counts, recv_counts, rt.ep_pg);

  // Received rows grouped by local expert: perm[i] is the received row at grouped position i.
  // Each source's rows are ordered by expert: walk them with one cursor per source.
  std::vector<int64_t> perm, inverse(static_cast<size_t>(src_offset[ep]));
  std::vector<int64_t> cursor(src_offset.begin(), src_offset.end() - 1);
  perm.reserve(inverse.size());
  for (int64_t j = 0; j < local; ++j) {
    for (int64_t src = 0; src < ep; ++src) {
      for (int64_t i = 0; i < got[src][j]; ++i) perm.push_back(cursor[src]++);
      expert_rows[j] += got[src][j];
    }
  }
  for (size_t i = 0; i < perm.size(); ++i) inverse[static_cast<size_t>(perm[i])] = static_cast<int64_t>(i);
  // With nothing received, the (empty) results still hang off `received`: the
  // combine's backward must run on every rank, or the peers that sent this
  // rank gradients would wait for it.
  at::Tensor processed = received.narrow(0, 0, 0);
  last_experts_hit_ = 0;
  if (!perm.empty()) {
    const at::Tensor grouped = dist::copyToTensorParallel(received, rt.tp_pg).index_select(0, at::tensor(perm));
    std::vector<at::Tensor> outs;
    for (int64_t j = 0, offset = 0; j < local; offset += expert_rows[j], ++j) {
      if (expert_rows[j] == 0) continue;
      ++last_experts_hit_;
      outs.push_back(experts->ptr<Qwen3MoeMLPImpl>(j)->forward(grouped.narrow(0, offset, expert_rows[j])));
    }
    processed = dist::reduceFromTensorParallel(at::cat(outs).index_select(0, at::tensor(inverse)), rt.tp_pg);
  }
  const at::Tensor combined = dist::allToAll(processed, recv_counts, send_counts, rt.ep_pg);
  at::Tensor out = at::zeros({flat.size(0), h}, x.options());
  out.index_add_(0, token, (combined * sorted.weight).to(out.scalar_type()));
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
