// One training step of a small block, checkpointed by an installed hpac under
// each policy, against the same step without checkpointing. Prints one line
// per policy and exits non-zero unless every gradient equals off's bit for bit
// (NaN is never equal) and the selective run served ops from hpac's storage.
#include "policy/checkpoint_policy.h"
#include "policy/selective_policy.h"
#include "replay/checkpoint.h"

#include <torch/torch.h>

#include <cstdio>
#include <memory>
#include <string>
#include <vector>

namespace {

struct Block {
  torch::nn::Linear up{nullptr}, down{nullptr};
  torch::nn::Dropout dropout{nullptr};
  Block() {
    torch::manual_seed(7);
    up = torch::nn::Linear(32, 64);
    down = torch::nn::Linear(64, 32);
    dropout = torch::nn::Dropout(0.1);
  }
  at::Tensor forward(const at::Tensor& x) {
    at::Tensor h = torch::gelu(torch::mm(x, up->weight.t()) + up->bias);
    at::Tensor scores = torch::softmax(torch::bmm(h.unsqueeze(0), h.t().unsqueeze(0)).squeeze(0), -1);
    return dropout->forward(down->forward(torch::mm(scores, h)) + x);
  }
  std::vector<at::Tensor> parameters() { return {up->weight, up->bias, down->weight, down->bias}; }
};

// Loss backward from the same seed; returns [input grad, parameter grads...].
std::vector<at::Tensor> step(Block& block, const at::Tensor& input, const hpac::CheckpointOptions* options) {
  torch::manual_seed(11);  // dropout's mask
  at::Tensor x = input.detach().requires_grad_(true);
  auto fn = [&](const at::Tensor& in) { return block.forward(in); };
  at::Tensor y = options ? hpac::checkpoint(fn, x, *options) : fn(x);
  std::vector<at::Tensor> wrt{x};
  for (const at::Tensor& p : block.parameters()) wrt.push_back(p);
  return torch::autograd::grad({y.pow(2).sum()}, wrt);
}

// Bitwise equal, and neither holds a NaN (NaN is never equal).
bool identical(const at::Tensor& a, const at::Tensor& b) {
  return a.sizes() == b.sizes() && !a.isnan().any().item<bool>() && !b.isnan().any().item<bool>() && a.equal(b);
}

}  // namespace

int main() {
  Block block;
  const at::Tensor x = torch::randn({16, 32});
  const std::vector<at::Tensor> off = step(block, x, nullptr);

  struct Run {
    std::string name;
    hpac::PolicyFactory policy;
  };
  const std::vector<Run> runs = {{"full", hpac::PolicyFactory{}},
                                 {"selective", hpac::selectivePolicy()},
                                 {"save list [aten::mm]", hpac::saveListPolicy({"aten::mm"})}};
  bool ok = true;
  for (const Run& run : runs) {
    hpac::CheckpointOptions options;
    options.policy = run.policy;
    options.stats_out = std::make_shared<hpac::InvocationStats>();
    const std::vector<at::Tensor> grads = step(block, x, &options);
    bool same = grads.size() == off.size();
    for (size_t i = 0; same && i < grads.size(); ++i) same = identical(grads[i], off[i]);
    const bool served_if_selective = run.policy ? options.stats_out->served > 0 : options.stats_out->served == 0;
    std::printf("%-22s ops fwd %3lld  saved %3lld  served %3lld  recomputed %3lld  gradients %s\n", run.name.c_str(),
                static_cast<long long>(options.stats_out->ops_forward), static_cast<long long>(options.stats_out->saved),
                static_cast<long long>(options.stats_out->served),
                static_cast<long long>(options.stats_out->recomputed), same ? "identical to off" : "DIFFER from off");
    ok = ok && same && served_if_selective && options.stats_out->recomputes == 1;
  }
  std::puts(ok ? "OK: an installed hpac checkpointed the step; every policy's gradients equal off's bit for bit"
               : "FAILED");
  return ok ? 0 : 1;
}
