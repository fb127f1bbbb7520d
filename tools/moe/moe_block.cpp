#include "tools/moe/moe_block.h"

#include "tools/moe/moe_router.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>

#include <cmath>
#include <limits>

namespace hpac {
namespace {

at::Tensor param(const at::Generator& gen, int64_t out, int64_t in) {
  at::Tensor w = at::empty({out, in}, at::kFloat);
  w.normal_(0.0, 1.0 / std::sqrt(static_cast<double>(in)), gen);
  w.set_requires_grad(true);
  return w;
}

}  // namespace

MoeBlock::MoeBlock(const MoeBlockConfig& config, uint64_t seed) : config_(config) {
  TORCH_CHECK(config.hidden % config.heads == 0, "MoeBlock: hidden (", config.hidden,
              ") must be divisible by heads (", config.heads, ")");
  TORCH_CHECK(config.top_k >= 1 && config.top_k <= config.experts, "MoeBlock: top_k (", config.top_k,
              ") must be in [1, experts=", config.experts, "]");
  at::Generator gen = at::detail::createCPUGenerator(seed);
  const int64_t h = config.hidden;
  wq_ = param(gen, h, h);
  wk_ = param(gen, h, h);
  wv_ = param(gen, h, h);
  wo_ = param(gen, h, h);
  router_ = param(gen, config.experts, h);
  for (int64_t e = 0; e < config.experts; ++e) {
    up_.push_back(param(gen, config.expert_hidden, h));
    down_.push_back(param(gen, h, config.expert_hidden));
  }
}

std::vector<at::Tensor> MoeBlock::parameters() const {
  std::vector<at::Tensor> p{wq_, wk_, wv_, wo_, router_};
  p.insert(p.end(), up_.begin(), up_.end());
  p.insert(p.end(), down_.begin(), down_.end());
  return p;
}

at::Tensor MoeBlock::attention(const at::Tensor& x) const {
  const int64_t b = x.size(0), s = x.size(1), h = config_.hidden, nh = config_.heads, hd = h / nh;
  auto heads = [&](const at::Tensor& w) { return at::linear(x, w).view({b, s, nh, hd}).transpose(1, 2); };
  const at::Tensor q = heads(wq_), k = heads(wk_), v = heads(wv_);
  at::Tensor scores = at::matmul(q, k.transpose(-2, -1)) / std::sqrt(static_cast<double>(hd));
  const at::Tensor causal = at::ones({s, s}, x.options().dtype(at::kBool)).triu(1);
  scores = scores.masked_fill(causal, -std::numeric_limits<float>::infinity());
  at::Tensor probs = at::softmax(scores, -1);
  probs = at::dropout(probs, config_.dropout, /*train=*/true);
  const at::Tensor ctx = at::matmul(probs, v).transpose(1, 2).reshape({b, s, h});
  return at::linear(ctx, wo_);
}

at::Tensor MoeBlock::moe(const at::Tensor& x) const {
  const at::Tensor flat = x.reshape({-1, config_.hidden});
  const TopKRouting routing =
      routeTopK(at::linear(flat, router_), config_.top_k, /*renormalize=*/true, x.scalar_type());
  at::Tensor out = at::zeros_like(flat);
  for (int64_t e = 0; e < config_.experts; ++e) {
    const ExpertTokens hit = tokensFor(routing, e);
    if (hit.empty()) continue;  // data-dependent: only the experts actually hit run
    const at::Tensor y = at::linear(at::silu(at::linear(flat.index_select(0, hit.token), up_[e])), down_[e]);
    out.index_add_(0, hit.token, y * hit.weight);
  }
  return out.view(x.sizes());
}

at::Tensor MoeBlock::forward(const at::Tensor& x) const {
  const at::Tensor h = x + attention(x);
  return h + moe(h);
}

}  // namespace hpac
