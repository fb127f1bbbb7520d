// hpac/tools/trainer/memory_target.h
//
// activation_checkpoint.memory_target in the C++ Trainer: the hooks that call
// StepDriver (policy/step_driver.h) with the tracking allocator's numbers, as
// plugin/python/hpac/_target.py's are Python's. Trainer::step's start and the
// optimizer step's end, each target layer's runLayer, and tensor hooks that
// fire when a layer output's gradient arrives (that layer's backward starts)
// or the first layer input's (the layers' backward ended); each layer runs in
// its budget region or unwrapped as the driver's plan says. The tensor hooks
// hold the front weakly; the layers own it (shared_ptr), as the Python model
// owns its target. One rank (the parallel Trainer refuses it: hpac.hf plans
// several ranks together). Not thread-safe: the training thread only.
#pragma once

#include "policy/step_driver.h"

#include <ATen/core/Tensor.h>

#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace hpac::trainer {

class MemoryTargetFront : public std::enable_shared_from_this<MemoryTargetFront> {
 public:
  using Log = std::function<void(bool warning, const std::string& message)>;
  MemoryTargetFront(std::unique_ptr<StepTarget> target, Log log);

  // Before a step's forward: closes the last step, plans or replans. Throws c10::Error with the floor's message
  // when the target is below it (nothing of the step has run), again at every later step.
  void stepBegin();
  // Before and after the optimizer step: what it grows (its state) is measured; what runs after it, before the
  // next step, is not counted.
  void optimizerBegins();
  void stepDone();
  // Around target layer i's forward (CheckpointableLayer::runLayer).
  void layerBegin(int64_t i, const std::vector<at::Tensor>& inputs);
  void layerEnd(int64_t i, const std::vector<at::Tensor>& outputs);
  // Whether the plan checkpoints layer i (every layer does in the profile step).
  bool checkpointed(int64_t i) const { return driver_.checkpointed(i); }

  const StepTarget& target() const { return driver_.target(); }

 private:
  void say(const std::vector<StepMessage>& messages) const;
  template <typename Mark>
  void hookBackward(const at::Tensor& t, Mark mark);

  StepDriver driver_;
  Log log_;
};

}  // namespace hpac::trainer
