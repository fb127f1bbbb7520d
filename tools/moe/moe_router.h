// hpac/tools/moe/moe_router.h
//
// Qwen3-MoE's top-k router, written once for every model of the project that
// routes tokens to experts: the demo's MoeBlock, the trainer's Qwen3-MoE
// replica (one rank, and its expert-parallel dispatch) and the multi-rank
// test worker.
//   routeTopK:    softmax over the router logits in float32, top-k, the top-k
//                 weights renormalised in place (Qwen3's norm_topk_prob)
//   tokensFor:    the tokens one expert serves and their routing weights
//   sortByExpert: the (token, slot) pairs ordered by expert, with per-expert
//                 counts: the send order of an expert-parallel all-to-all
// The number of ops these issue depends on the routing (tokensFor of an expert
// nobody chose returns empty tensors and the caller skips the expert), which is
// what makes MoE layers hard for a checkpoint: the recompute must meet the same
// sequence, and it does because routing is replayed from the same inputs.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>

namespace hpac {

struct TopKRouting {
  at::Tensor weights;  // [tokens, top_k], routing weights in the requested dtype
  at::Tensor experts;  // [tokens, top_k] int64, the chosen experts
  int64_t top_k = 0;
};

// logits: [tokens, experts]. `renormalize`: divide the top-k weights by their
// sum in place (norm_topk_prob). Weights are converted to `dtype` last.
TopKRouting routeTopK(const at::Tensor& logits, int64_t top_k, bool renormalize, at::ScalarType dtype);

struct ExpertTokens {
  at::Tensor token;   // [n] int64, rows of the flattened input routed to the expert
  at::Tensor weight;  // [n, 1], their routing weights
  bool empty() const { return token.numel() == 0; }
};

// The tokens routed to `expert` (any slot), in token order.
ExpertTokens tokensFor(const TopKRouting& routing, int64_t expert);

struct ExpertOrder {
  at::Tensor order;       // [tokens * top_k] int64: flat (token, slot) indices, stably sorted by expert
  at::Tensor token;       // [tokens * top_k] int64: the token of each, order / top_k
  at::Tensor weight;      // [tokens * top_k, 1]: the routing weight of each
  at::Tensor per_expert;  // [num_experts] int64: how many pairs each expert got
};

ExpertOrder sortByExpert(const TopKRouting& routing, int64_t num_experts);

}  // namespace hpac
