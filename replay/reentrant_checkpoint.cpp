#include "replay/reentrant_checkpoint.h"

#include "replay/region.h"
#include "replay/rng_state.h"

#include <ATen/core/grad_mode.h>
#include <c10/util/Exception.h>
#include <c10/util/Optional.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/autograd/custom_function.h>

namespace hpac {
namespace {

using torch::autograd::variable_list;

struct ReentrantState : torch::CustomClassHolder {
  CheckpointFn fn;
  RngState rng;
  bool preserve_rng = true;
  size_t num_inputs = 0;
  std::unique_ptr<Invocation> invocation;
  std::shared_ptr<InvocationStats> stats_out;
  ~ReentrantState() override {
    if (stats_out && invocation) *stats_out = invocation->stats();
  }
};

struct ReentrantCheckpoint : public torch::autograd::Function<ReentrantCheckpoint> {
  // Runs under no-grad (Function::apply). `params` must be a TensorList so that
  // autograd treats each entry as an input (a std::vector argument is not).
  static variable_list forward(torch::autograd::AutogradContext* ctx, c10::intrusive_ptr<ReentrantState> state,
                               at::TensorList inputs, at::TensorList params) {
    std::vector<at::Tensor> saved(inputs.begin(), inputs.end());
    saved.insert(saved.end(), params.begin(), params.end());
    ctx->save_for_backward(saved);
    std::vector<at::Tensor> outputs;
    {
      RegionGuard region(*state->invocation, Phase::kForward);
      outputs = state->fn(inputs.vec());
      region.end();  // Note [Ending a region can fail]
    }
    ctx->saved_data["state"] = c10::IValue::make_capsule(state);
    return outputs;
  }

  static variable_list backward(torch::autograd::AutogradContext* ctx, variable_list grad_outputs) {
    auto state = c10::static_intrusive_pointer_cast<ReentrantState>(ctx->saved_data["state"].toCapsule());
    const variable_list saved = ctx->get_saved_variables();
    std::vector<at::Tensor> inputs;
    for (size_t i = 0; i < state->num_inputs; ++i) {
      at::Tensor t = saved[i].defined() ? detachedAlias(saved[i]) : saved[i];
      if (saved[i].defined() && saved[i].requires_grad()) t.set_requires_grad(true);
      inputs.push_back(std::move(t));
    }
    std::vector<at::Tensor> outputs;
    {
      c10::optional<RngFork> rng;
      if (state->preserve_rng) rng.emplace(state->rng);
      at::AutoGradMode grad_enabled(true);
      RegionGuard region(*state->invocation, Phase::kRecompute);
      outputs = state->fn(inputs);
      region.end();
    }
    // Differentiate the recomputed outputs with respect to inputs and parameters.
    std::vector<at::Tensor> roots, root_grads, wrt;
    std::vector<size_t> wrt_index;
    for (size_t i = 0; i < outputs.size() && i < grad_outputs.size(); ++i) {
      if (outputs[i].defined() && outputs[i].requires_grad() && grad_outputs[i].defined()) {
        roots.push_back(outputs[i]);
        root_grads.push_back(grad_outputs[i]);
      }
    }
    for (size_t i = 0; i < saved.size(); ++i) {
      const at::Tensor& t = i < state->num_inputs ? inputs[i] : saved[i];
      if (t.defined() && t.requires_grad()) {
        wrt.push_back(t);
        wrt_index.push_back(i);
      }
    }
    variable_list result(1 + saved.size());  // slot 0: the state argument
    if (roots.empty() || wrt.empty()) return result;
    const variable_list grads = torch::autograd::grad(roots, wrt, root_grads, /*retain_graph=*/false,
                                                      /*create_graph=*/false, /*allow_unused=*/true);
    for (size_t k = 0; k < wrt.size(); ++k) result[1 + wrt_index[k]] = grads[k];
    return result;
  }
};

}  // namespace

std::vector<at::Tensor> reentrantCheckpoint(const CheckpointFn& fn, const std::vector<at::Tensor>& inputs,
                                            const CheckpointOptions& options) {
  TORCH_CHECK(!options.policy, "hpac: the reentrant checkpoint recomputes everything and takes no policy; "
                               "use the non-reentrant checkpoint (use_reentrant=false) for selective checkpointing");
  TORCH_CHECK(!options.explain, "hpac: the reentrant checkpoint has no invocation to explain; "
                                "use the non-reentrant checkpoint (use_reentrant=false) with explain");
  auto state = c10::make_intrusive<ReentrantState>();
  state->fn = fn;
  state->preserve_rng = options.preserve_rng_state;
  if (state->preserve_rng) state->rng = RngState::capture(inputs);
  state->num_inputs = inputs.size();
  state->invocation = std::make_unique<Invocation>(PolicyFactory{});
  state->stats_out = options.stats_out;
  return ReentrantCheckpoint::apply(state, at::TensorList(inputs), at::TensorList(options.parameters));
}


}  // namespace hpac
