#include "tools/moe/moe_router.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include <tuple>

namespace hpac {

TopKRouting routeTopK(const at::Tensor& logits, int64_t top_k, bool renormalize, at::ScalarType dtype) {
  TORCH_CHECK(logits.dim() == 2, "routeTopK: logits must be [tokens, experts], got ", logits.sizes());
  TORCH_CHECK(top_k >= 1 && top_k <= logits.size(1), "routeTopK: top_k (", top_k, ") must be in [1, experts=",
              logits.size(1), "]");
  TopKRouting r;
  r.top_k = top_k;
  std::tie(r.weights, r.experts) = at::topk(at::softmax(logits, -1, at::kFloat), top_k, -1);
  if (renormalize) r.weights.div_(r.weights.sum(-1, /*keepdim=*/true));  // in place, as Qwen3
  r.weights = r.weights.to(dtype);
  return r;
}

ExpertTokens tokensFor(const TopKRouting& routing, int64_t expert) {
  const auto hit = at::where(routing.experts == expert);  // (token, slot) pairs routed to the expert
  ExpertTokens out;
  out.token = hit[0];
  if (out.empty()) return out;
  out.weight = routing.weights.flatten().index_select(0, hit[0] * routing.top_k + hit[1]).unsqueeze(-1);
  return out;
}

ExpertOrder sortByExpert(const TopKRouting& routing, int64_t num_experts) {
  const at::Tensor choice = routing.experts.reshape({-1});
  ExpertOrder out;
  out.order = std::get<1>(at::sort(choice, /*stable=*/true, 0, /*descending=*/false));
  out.token = at::div(out.order, routing.top_k, "floor");
  out.weight = routing.weights.reshape({-1}).index_select(0, out.order).unsqueeze(-1);
  out.per_expert = at::bincount(choice, {}, num_experts);
  return out;
}

}  // namespace hpac
