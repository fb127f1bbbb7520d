// hpac/tools/trainer/zoo_common.h
//
// What every model of the trainer's zoo shares: the Hugging Face style config
// object the trainer edits (use_cache, KV sharing, sub-configs), the ZooModel
// interface, deterministic initialisation from a seed, and the building blocks
// (RMSNorm, RoPE, eager causal attention, the LM loss).
#pragma once

#include "tools/trainer/config.h"

#include <torch/nn/module.h>
#include <torch/nn/modules/container/any.h>

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>

namespace hpac::trainer {

// ModelConfig: the parts of a Hugging Face PretrainedConfig the trainer reads
// and writes. Multimodal models nest `text_config`, `vision_config`, ...
struct ModelConfig {
  std::string model_type;
  bool use_cache = true;
  int64_t num_kv_shared_layers = 0;
  std::map<std::string, std::shared_ptr<ModelConfig>> sub_configs;

  // Visits this config ("config") and every sub-config ("config.text_config", ...).
  void forEach(const std::function<void(const std::string& path, ModelConfig& config)>& fn,
               const std::string& path = "config");
  // num_kv_shared_layers > 0 here or in any sub-config.
  bool sharesKv();
};

// ZooModel: a root module of the zoo. Its class name (torch::nn::Module::name())
// is the Hugging Face class name discovery looks up in the registry.
class ZooModel : public torch::nn::Module {
 public:
  explicit ZooModel(std::string class_name) : torch::nn::Module(std::move(class_name)) {}

  ModelConfig& config() { return config_; }
  // HF's `supports_gradient_checkpointing`: the model's own (native) path exists.
  virtual bool supportsGradientCheckpointing() const { return true; }
  // Training loss on token ids [batch, seq] (next-token loss unless the model says otherwise).
  virtual at::Tensor loss(const at::Tensor& tokens) = 0;
  // The input embeddings of the last loss() call with their gradient retained
  // (the "input gradient" of parity tests); undefined where a model has none.
  const at::Tensor& lastInputEmbeds() const { return last_input_embeds_; }

 protected:
  // Keeps `embeds` (retaining its gradient) as lastInputEmbeds(); returns it.
  at::Tensor keepInputEmbeds(at::Tensor embeds);

  ModelConfig config_;
  at::Tensor last_input_embeds_;
};

// Builds the zoo model a spec's preset names, initialised deterministically
// from `seed` (same seed and spec: bitwise-identical parameters).
std::shared_ptr<ZooModel> makeZooModel(const ModelSpec& spec, uint64_t seed);

// Norm weights 1, biases 0, every other parameter N(0, std) drawn from a
// generator seeded with `seed`, in module registration order.
void initWeights(torch::nn::Module& model, uint64_t seed, double std = 0.02);

// RMSNorm as Qwen3 writes it: computed in float32, weight applied in the input dtype.
class RMSNormImpl : public torch::nn::Module {
 public:
  RMSNormImpl(int64_t dim, double eps);
  at::Tensor forward(const at::Tensor& x);
  at::Tensor weight;

 private:
  double eps_;
};
TORCH_MODULE(RMSNorm);

// Rotary position embedding tables for positions [0, seq): cos/sin [seq, head_dim].
struct Rope {
  at::Tensor cos, sin;
};
Rope ropeTables(int64_t seq, int64_t head_dim, double theta, at::ScalarType dtype);
// x: [batch, heads, seq, head_dim]
at::Tensor applyRope(const at::Tensor& x, const Rope& rope);

// Eager attention as HF's eager_attention_forward: q [B, Hq, S, D], k/v
// [B, Hkv, S, D] (repeated to Hq heads), softmax in float32; causal when asked.
// Returns [B, S, Hq * D].
at::Tensor eagerAttention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, bool causal);

// GELU, tanh approximation, from elementwise ops: HF's gelu_new (GPT-2) and
// gelu_pytorch_tanh (SigLIP). Not at::gelu: its CPU kernel may go through oneDNN,
// whose scratch buffers come from Allocator::raw_allocate, which the core's
// TrackingAllocator does not support (docs/trainer.md, "Known limits").
at::Tensor geluTanh(const at::Tensor& x);

// Mean next-token cross entropy of logits [B, S, V] against tokens [B, S].
at::Tensor nextTokenLoss(const at::Tensor& logits, const at::Tensor& tokens);

}  // namespace hpac::trainer
