#include "tools/trainer/zoo_common.h"

#include "tools/trainer/qwen3_moe.h"
#include "tools/trainer/zoo_models.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <torch/nn/modules/embedding.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/modules/normalization.h>

#include <cmath>
#include <limits>

namespace hpac::trainer {

void ModelConfig::forEach(const std::function<void(const std::string&, ModelConfig&)>& fn, const std::string& path) {
  fn(path, *this);
  for (auto& [name, sub] : sub_configs) sub->forEach(fn, path + "." + name);
}

bool ModelConfig::sharesKv() {
  bool shares = false;
  forEach([&](const std::string&, ModelConfig& c) { shares = shares || c.num_kv_shared_layers > 0; });
  return shares;
}

at::Tensor ZooModel::keepInputEmbeds(at::Tensor embeds) {
  if (embeds.requires_grad()) embeds.retain_grad();
  last_input_embeds_ = embeds;
  return embeds;
}

std::shared_ptr<ZooModel> makeZooModel(const ModelSpec& spec, uint64_t seed) {
  std::shared_ptr<ZooModel> model;
  const std::string& p = spec.preset;
  if (p == "qwen3_moe_tiny" || p == "qwen3_moe_30b_a3b") {
    model = std::make_shared<Qwen3MoeForCausalLM>(spec);
  } else if (p == "gpt2_tiny") {
    model = std::make_shared<GPT2LMHeadModel>(spec);
  } else if (p == "pipeline_stage_tiny") {
    model = std::make_shared<PipelineStageModel>(spec);
  } else if (p == "llava_tiny") {
    model = std::make_shared<LlavaForConditionalGeneration>(spec);
  } else if (p == "gemma3n_kv_tiny") {
    model = std::make_shared<Gemma3nForConditionalGeneration>(spec);
  } else if (p == "bi_encoder_tiny") {
    model = std::make_shared<BiEncoderModel>(spec);
  } else if (p == "custom_blocks_tiny") {
    model = std::make_shared<CustomBlocksModel>(spec);
  } else {
    TORCH_CHECK(false, "hpac: model preset '", p, "' has no zoo model; allowed: ", [] {
      std::string all;
      for (const std::string& n : modelPresetNames()) all += (all.empty() ? "" : ", ") + n;
      return all;
    }());
  }
  initWeights(*model, seed);
  return model;
}

void initWeights(torch::nn::Module& model, uint64_t seed, double std) {
  at::Generator gen = at::detail::createCPUGenerator(seed);
  at::NoGradGuard no_grad;
  for (const auto& module : model.modules(/*include_self=*/true)) {
    const bool is_norm = dynamic_cast<RMSNormImpl*>(module.get()) != nullptr ||
                         dynamic_cast<torch::nn::LayerNormImpl*>(module.get()) != nullptr;
    for (auto& item : module->named_parameters(/*recurse=*/false)) {
      at::Tensor& p = item.value();
      if (item.key() == "bias") {
        p.zero_();
      } else if (is_norm) {
        p.fill_(1.0);
      } else {
        p.normal_(0.0, std, gen);
      }
    }
  }
}

RMSNormImpl::RMSNormImpl(int64_t dim, double eps) : torch::nn::Module("RMSNorm"), eps_(eps) {
  weight = register_parameter("weight", at::ones({dim}));
}

at::Tensor RMSNormImpl::forward(const at::Tensor& x) {
  const at::Tensor h = x.to(at::kFloat);
  const at::Tensor variance = h.pow(2).mean(-1, /*keepdim=*/true);
  return weight * (h * at::rsqrt(variance + eps_)).to(x.scalar_type());
}

Rope ropeTables(int64_t seq, int64_t head_dim, double theta, at::ScalarType dtype) {
  const at::Tensor inv_freq =
      1.0 / at::pow(theta, at::arange(0, head_dim, 2, at::kDouble) / static_cast<double>(head_dim));
  const at::Tensor freqs = at::outer(at::arange(seq, at::kDouble), inv_freq);
  const at::Tensor emb = at::cat({freqs, freqs}, -1);
  return {emb.cos().to(dtype), emb.sin().to(dtype)};
}

at::Tensor applyRope(const at::Tensor& x, const Rope& rope) {
  const int64_t half = x.size(-1) / 2;
  const at::Tensor rotated = at::cat({-x.narrow(-1, half, half), x.narrow(-1, 0, half)}, -1);
  return x * rope.cos + rotated * rope.sin;
}

at::Tensor eagerAttention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, bool causal) {
  const int64_t b = q.size(0), hq = q.size(1), s = q.size(2), d = q.size(3), groups = hq / k.size(1);
  auto repeat = [&](const at::Tensor& t) {  // repeat_kv: [B, Hkv, S, D] -> [B, Hq, S, D]
    if (groups == 1) return t;
    return t.unsqueeze(2).expand({b, t.size(1), groups, s, d}).reshape({b, hq, s, d});
  };
  at::Tensor scores = at::matmul(q, repeat(k).transpose(2, 3)) * (1.0 / std::sqrt(static_cast<double>(d)));
  if (causal) {
    const at::Tensor mask = at::ones({s, s}, q.options().dtype(at::kBool)).triu(1);
    scores = scores.masked_fill(mask, -std::numeric_limits<float>::infinity());
  }
  const at::Tensor probs = at::softmax(scores, -1, at::kFloat).to(q.scalar_type());
  return at::matmul(probs, repeat(v)).transpose(1, 2).reshape({b, s, hq * d});
}

at::Tensor geluTanh(const at::Tensor& x) {
  const double k = std::sqrt(2.0 / M_PI);
  return 0.5 * x * (1.0 + at::tanh(k * (x + 0.044715 * x * x * x)));
}

at::Tensor nextTokenLoss(const at::Tensor& logits, const at::Tensor& tokens) {
  const int64_t s = logits.size(1), v = logits.size(2);
  const at::Tensor pred = logits.narrow(1, 0, s - 1).reshape({-1, v}).to(at::kFloat);
  const at::Tensor target = tokens.narrow(1, 1, s - 1).reshape({-1});
  return at::cross_entropy_loss(pred, target);
}

}  // namespace hpac::trainer
