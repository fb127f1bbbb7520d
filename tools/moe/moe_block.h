// hpac/tools/moe/moe_block.h
//
// MoeBlock: a small transformer block in the shape of a Qwen3-MoE layer, built
// from ATen ops on plain parameter tensors, for the demo, tests and benchmarks
// of the core. Attention: bias-free q/k/v/o projections, causal softmax
// attention (q @ k^T arrives as bmm on torch 1.13), dropout on the attention
// probabilities. MoE: the router of tools/moe/moe_router.h (softmax in
// float32, topk, in-place renormalisation of the top-k weights), experts
// (up/down projections with SiLU) looped over the experts actually hit, results
// written back with in-place index_add_. The number of matmuls depends on the
// routing. The trainer's Qwen3-MoE replica with HF module names is
// tools/trainer/qwen3_moe.h; both route with the same router.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <vector>

namespace hpac {

struct MoeBlockConfig {
  int64_t hidden = 64;
  int64_t heads = 4;
  int64_t experts = 4;
  int64_t expert_hidden = 96;
  int64_t top_k = 2;
  double dropout = 0.1;
};

class MoeBlock {
 public:
  // Parameters drawn from a generator seeded with `seed` (deterministic).
  MoeBlock(const MoeBlockConfig& config, uint64_t seed);

  // x: [batch, seq, hidden] -> [batch, seq, hidden]
  at::Tensor forward(const at::Tensor& x) const;

  std::vector<at::Tensor> parameters() const;
  const MoeBlockConfig& config() const { return config_; }

 private:
  at::Tensor attention(const at::Tensor& x) const;
  at::Tensor moe(const at::Tensor& x) const;

  MoeBlockConfig config_;
  at::Tensor wq_, wk_, wv_, wo_, router_;
  std::vector<at::Tensor> up_, down_;
};

}  // namespace hpac
