#include "tools/trainer/checkpointable.h"

#include "policy/selective_policy.h"

#include <ATen/core/grad_mode.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <utility>

namespace hpac::trainer {

void CheckpointableLayer::setCheckpoint(CheckpointSetting setting) {
  TORCH_CHECK(setting.layer == CheckpointMode::kOff || setting.submodules.empty(), "hpac: layer ", name(),
              ": whole-layer and submodule checkpointing cannot be combined (checkpoint regions do not nest)");
  TORCH_CHECK(!setting.reentrant || setting.layer == CheckpointMode::kFull, "hpac: layer ", name(),
              ": the reentrant (native) path is full checkpointing only, got mode ", toString(setting.layer));
  TORCH_CHECK(!setting.target || setting.layer == CheckpointMode::kBudget, "hpac: layer ", name(),
              ": a memory target plans budget layers only, got mode ", toString(setting.layer));
  TORCH_CHECK((setting.layer == CheckpointMode::kBudget) == (setting.budget != nullptr), "hpac: layer ", name(),
              ": mode budget needs a BudgetRegion and only mode budget takes one (mode ", toString(setting.layer),
              setting.budget ? ", with a region)" : ", no region)");
  const auto children = named_children();
  for (const auto& [child, mode] : setting.submodules) {
    TORCH_CHECK(children.contains(child), "hpac: layer ", name(), " has no submodule '", child,
                "' to checkpoint");
    TORCH_CHECK(mode != CheckpointMode::kOff && mode != CheckpointMode::kBudget, "hpac: layer ", name(), ": submodule '", child,
                "' listed with mode ", toString(mode), "; allowed for submodules: full, selective");
  }
  setting_ = std::move(setting);
}

void CheckpointableLayer::foldFinished() {
  // A stats_out slot is filled when the invocation's graph is released, at
  // which point the checkpoint dropped its reference to it.
  auto done = [](const std::shared_ptr<InvocationStats>& s) { return s.use_count() == 1; };
  for (const auto& s : pending_) {
    if (!done(s)) continue;
    finished_.totals += *s;
    ++finished_.invocations;
  }
  pending_.erase(std::remove_if(pending_.begin(), pending_.end(), done), pending_.end());
}

LayerStats CheckpointableLayer::takeStats() {
  foldFinished();
  return std::exchange(finished_, LayerStats{});
}

CheckpointOptions CheckpointableLayer::options(CheckpointMode mode, bool reentrant) {
  CheckpointOptions options;
  if (mode == CheckpointMode::kBudget) {
    options.policy = setting_.budget->factory();  // the layer's region, not the mode's (checkpointOptionsFor refuses)
  } else {
    options = checkpointOptionsFor(mode);
    if (mode == CheckpointMode::kSelective && setting_.selective_policy) options.policy = setting_.selective_policy;
  }
  options.routing = setting_.routing;
  options.state_writes = setting_.state_writes;
  if (reentrant) {
    options.use_reentrant = true;
    for (const at::Tensor& p : parameters()) {
      if (p.requires_grad()) options.parameters.push_back(p);
    }
  }
  if (explain_ && !reentrant) {  // explain's caller reads these stats itself
    options.explain = std::move(explain_);
    options.stats_out = std::move(explain_stats_);
    explain_.reset();
    explain_stats_.reset();
    return options;
  }
  foldFinished();  // bounded by the graphs alive, whether or not anyone takes the stats (Note [Nothing outlives its model])
  options.stats_out = pending_.emplace_back(std::make_shared<InvocationStats>());
  return options;
}

std::vector<at::Tensor> CheckpointableLayer::runLayer(const std::vector<at::Tensor>& inputs,
                                                      const CheckpointFn& body) {
  // Evaluation or no-grad: nothing to checkpoint (and no invocation to count).
  if (setting_.layer == CheckpointMode::kOff || !is_training() || !at::GradMode::is_enabled()) return body(inputs);
  if (setting_.target) {  // memory_target: the step's events around the layer, checkpointed as the plan says
    MemoryTargetFront& t = *setting_.target;
    t.layerBegin(setting_.target_index, inputs);
    std::vector<at::Tensor> out = t.checkpointed(setting_.target_index)
                                      ? checkpoint(body, inputs, options(setting_.layer, setting_.reentrant))
                                      : body(inputs);
    t.layerEnd(setting_.target_index, out);
    return out;
  }
  return checkpoint(body, inputs, options(setting_.layer, setting_.reentrant));
}

at::Tensor CheckpointableLayer::callSubmodule(const std::string& name, const at::Tensor& input,
                                              const std::function<at::Tensor(const at::Tensor&)>& fn) {
  auto it = setting_.submodules.find(name);
  if (it == setting_.submodules.end() || !is_training() || !at::GradMode::is_enabled()) return fn(input);
  return checkpoint(fn, input, options(it->second, /*reentrant=*/false));
}

}  // namespace hpac::trainer
