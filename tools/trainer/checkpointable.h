// hpac/tools/trainer/checkpointable.h
//
// CheckpointableLayer: the opt-in seam through which the trainer switches
// activation checkpointing per layer and per submodule (the C++ counterpart of
// Hugging Face's GradientCheckpointingLayer).
//
// torch::nn::Module has no forward hooks, and replacing a child does not change
// the typed member a parent's forward calls. So nothing is replaced: a layer of
// the model zoo derives from CheckpointableLayer, runs its body through
// runLayer(), and calls each submodule through callSubmodule(name, ...). Both
// consult the layer's CheckpointSetting, which the trainer sets:
//
//   struct MyLayerImpl : hpac::trainer::CheckpointableLayer {
//     at::Tensor forward(const at::Tensor& x) {
//       return runLayer({x}, [this](const std::vector<at::Tensor>& in) {
//         at::Tensor h = in[0] + callSubmodule("attn", in[0], [this](const at::Tensor& t) { return attn->forward(t); });
//         return std::vector<at::Tensor>{h + callSubmodule("mlp", h, [this](const at::Tensor& t) { return mlp->forward(t); })};
//       })[0];
//     }
//   };
//
// The functions given to runLayer() and callSubmodule() run again during
// backward (the recompute), long after forward returned: capture by value
// (`this`, tensors), never a reference to a local of forward.
//
// Because the module tree is untouched, named_parameters() and state_dict keys
// are the same with and without checkpointing, and a model saved in one state
// loads into the other.
//
// Checkpoints run through hpac::checkpoint: `full` recomputes everything
// (non-reentrant, or the reentrant "native" path with the layer's parameters),
// `selective` uses hpac::selectivePolicy(). Each call is one invocation; its
// InvocationStats arrive when autograd releases its graph, and takeStats()
// collects them. Not thread-safe: one training thread per layer.
#pragma once

#include "policy/budget_policy.h"
#include "replay/checkpoint.h"
#include "replay/checkpoint_mode.h"
#include "replay/invocation.h"
#include "tools/trainer/memory_target.h"

#include <torch/nn/module.h>

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

namespace hpac::trainer {

// How one layer is checkpointed. Either the whole layer (`layer` != off) or a
// set of its submodule call sites, never both (regions do not nest).
struct CheckpointSetting {
  CheckpointMode layer = CheckpointMode::kOff;
  // Whole layer, full only: the reentrant path with the layer's parameters.
  bool reentrant = false;
  // Call-site (child) name -> mode (off, full or selective).
  std::map<std::string, CheckpointMode> submodules;
  // Whole layer, budget only: the layer's region (its profile and plan, kept
  // across steps; policy/budget_policy.h).
  std::shared_ptr<BudgetRegion> budget;
  // activation_checkpoint.routing / .state_writes (replay/recompute_rules.h).
  RoutingRule routing = RoutingRule::kVerify;
  StateWriteRule state_writes = StateWriteRule::kWarn;
  // Mode selective (whole layer or submodule): activation_checkpoint.policy's policy; empty = the built-in rules.
  PolicyFactory selective_policy;
  // Whole layer, budget only, under activation_checkpoint.memory_target: the step's target and this layer's index
  // in it (tools/trainer/memory_target.h): it marks the layer's events and says whether the plan checkpoints it.
  std::shared_ptr<MemoryTargetFront> target;
  int64_t target_index = -1;

  bool enabled() const { return layer != CheckpointMode::kOff || !submodules.empty(); }
};

// The invocations of one layer whose graphs were released, summed.
struct LayerStats {
  int64_t invocations = 0;
  InvocationStats totals;
};

class CheckpointableLayer : public torch::nn::Module {
 public:
  explicit CheckpointableLayer(std::string class_name) : torch::nn::Module(std::move(class_name)) {}

  // Throws c10::Error for a setting that mixes whole-layer and submodule
  // checkpointing, reentrant with a non-full mode, or names a submodule that is
  // not a child of this layer.
  void setCheckpoint(CheckpointSetting setting);
  void clearCheckpoint() { setting_ = {}; }
  const CheckpointSetting& checkpointSetting() const { return setting_; }

  // Stats of the invocations finished since the last call (graphs released);
  // invocations still pending stay for a later call.
  LayerStats takeStats();
  // Invocations counted but not yet folded into the stats (their graphs may be alive): bounded by the graphs
  // alive, whether or not takeStats() is ever called.
  size_t pendingInvocations() const { return pending_.size(); }

  // The layer's native checkpoint support (the reentrant whole-layer path).
  // Zoo layers all have it; a layer that cannot run its body twice returns false.
  virtual bool supportsNativeCheckpoint() const { return true; }

  // Explain (hpac-train --explain): the layer's next non-reentrant checkpoint
  // call records its ops into `recorder` and its stats into `stats`.
  void explainNextCheckpoint(std::shared_ptr<DecisionRecorder> recorder, std::shared_ptr<InvocationStats> stats) {
    explain_ = std::move(recorder);
    explain_stats_ = std::move(stats);
  }

 protected:
  // Runs the layer body, checkpointed whole when the setting says so.
  std::vector<at::Tensor> runLayer(const std::vector<at::Tensor>& inputs, const CheckpointFn& body);
  // Calls the child `name` through `fn`, checkpointed when the setting names it.
  at::Tensor callSubmodule(const std::string& name, const at::Tensor& input,
                           const std::function<at::Tensor(const at::Tensor&)>& fn);

 private:
  CheckpointOptions options(CheckpointMode mode, bool reentrant);
  // Adds the stats of the invocations whose graphs were released to finished_ and drops their slots.
  void foldFinished();

  CheckpointSetting setting_;
  std::vector<std::shared_ptr<InvocationStats>> pending_;  // one per invocation whose graph may be alive
  LayerStats finished_;                                     // released since the last takeStats()
  std::shared_ptr<DecisionRecorder> explain_;
  std::shared_ptr<InvocationStats> explain_stats_;
};

}  // namespace hpac::trainer
