// hpac/tools/trainer/qwen3_moe.h
//
// A Qwen3-MoE replica in torch::nn with the Hugging Face module names
// (../shared/DESIGN.md): model.embed_tokens, model.layers[i] (self_attn with
// q/k/v/o_proj and q_norm/k_norm over head_dim, input_layernorm,
// post_attention_layernorm, mlp = sparse MoE block with gate and experts[j]
// gate/up/down_proj), model.norm, lm_head. No biases. GQA, RoPE, causal mask.
// Router: softmax in float32 -> topk -> in-place renormalisation when
// norm_topk_prob -> cast back; experts loop over the experts actually hit and
// write back with in-place index_add_, so the matmul count depends on the data.
// Sizes from a ModelSpec (qwen3_moe_tiny ... qwen3_moe_30b_a3b).
#pragma once

#include "tools/moe/moe_router.h"
#include "tools/trainer/checkpointable.h"
#include "tools/trainer/zoo_common.h"

#include <torch/nn/modules/container/modulelist.h>
#include <torch/nn/modules/embedding.h>
#include <torch/nn/modules/linear.h>

#include <utility>

namespace hpac::trainer {

struct ParallelRuntime;  // parallel.h

class Qwen3MoeAttentionImpl : public torch::nn::Module {
 public:
  explicit Qwen3MoeAttentionImpl(const ModelSpec& spec);
  at::Tensor forward(const at::Tensor& x, const Rope& rope);
  // Runs the tensor-parallel forward from now on (shardQwen3Moe).
  void setParallel(std::shared_ptr<const ParallelRuntime> rt) { par_ = std::move(rt); }
  torch::nn::Linear q_proj{nullptr}, k_proj{nullptr}, v_proj{nullptr}, o_proj{nullptr};
  RMSNorm q_norm{nullptr}, k_norm{nullptr};

 private:
  // Heads split over the TP group: column-parallel q/k/v, row-parallel o with
  // its output all-reduced; with fsdp each projection is all-gathered first.
  at::Tensor forwardParallel(const at::Tensor& x, const Rope& rope);
  int64_t heads_, kv_heads_, head_dim_;
  std::shared_ptr<const ParallelRuntime> par_;
};
TORCH_MODULE(Qwen3MoeAttention);

// One expert (also the dense MLP of other zoo layers): down(silu(gate(x)) * up(x)).
class Qwen3MoeMLPImpl : public torch::nn::Module {
 public:
  Qwen3MoeMLPImpl(int64_t hidden, int64_t intermediate);
  at::Tensor forward(const at::Tensor& x);
  torch::nn::Linear gate_proj{nullptr}, up_proj{nullptr}, down_proj{nullptr};
};
TORCH_MODULE(Qwen3MoeMLP);

class Qwen3MoeSparseMoeBlockImpl : public torch::nn::Module {
 public:
  explicit Qwen3MoeSparseMoeBlockImpl(const ModelSpec& spec);
  at::Tensor forward(const at::Tensor& x);
  // Experts that received at least one token in the last forward call (this rank's, when parallel).
  int64_t lastExpertsHit() const { return last_experts_hit_; }
  // Runs the expert-parallel forward from now on (shardQwen3Moe).
  void setParallel(std::shared_ptr<const ParallelRuntime> rt) { par_ = std::move(rt); }
  torch::nn::Linear gate{nullptr};
  torch::nn::ModuleList experts{nullptr};

 private:
  // Tokens dispatched all-to-all to the EP rank owning their expert, the
  // experts' width split over the TP group, results combined all-to-all.
  at::Tensor forwardParallel(const at::Tensor& x);
  // The router (tools/moe/moe_router.h) over tokens [N, hidden], weights in their dtype.
  TopKRouting route(const at::Tensor& flat);
  std::shared_ptr<const ParallelRuntime> par_;
  int64_t num_experts_, top_k_;
  bool norm_topk_prob_;
  int64_t last_experts_hit_ = 0;
};
TORCH_MODULE(Qwen3MoeSparseMoeBlock);

class Qwen3MoeDecoderLayerImpl : public CheckpointableLayer {
 public:
  explicit Qwen3MoeDecoderLayerImpl(const ModelSpec& spec);
  at::Tensor forward(const at::Tensor& x, const Rope& rope);
  Qwen3MoeAttention self_attn{nullptr};
  Qwen3MoeSparseMoeBlock mlp{nullptr};
  RMSNorm input_layernorm{nullptr}, post_attention_layernorm{nullptr};
};
TORCH_MODULE(Qwen3MoeDecoderLayer);

class Qwen3MoeModelImpl : public torch::nn::Module {
 public:
  explicit Qwen3MoeModelImpl(const ModelSpec& spec);
  // Hidden states after the final norm for input embeddings [B, S, H].
  at::Tensor forward(const at::Tensor& inputs_embeds);
  torch::nn::Embedding embed_tokens{nullptr};
  torch::nn::ModuleList layers{nullptr};
  RMSNorm norm{nullptr};

 private:
  ModelSpec spec_;
};
TORCH_MODULE(Qwen3MoeModel);

class Qwen3MoeForCausalLM : public ZooModel {
 public:
  explicit Qwen3MoeForCausalLM(const ModelSpec& spec);
  at::Tensor loss(const at::Tensor& tokens) override;
  at::Tensor logits(const at::Tensor& tokens);
  Qwen3MoeModel model{nullptr};
  torch::nn::Linear lm_head{nullptr};
};

}  // namespace hpac::trainer
