#include "tools/trainer/memory_target.h"

#include "replay/tracking_allocator.h"

#include <ATen/core/grad_mode.h>
#include <c10/util/Exception.h>

#include <utility>

namespace hpac::trainer {

MemoryTargetFront::MemoryTargetFront(std::unique_ptr<StepTarget> target, Log log)
    : target_(std::move(target)), log_(std::move(log)) {
  layers_ = static_cast<int64_t>(target_->layerPlans().size());
  TORCH_CHECK(TrackingAllocator::installed(), "hpac-train: activation_checkpoint.memory_target reads hpac's tracking "
              "allocator, which is not installed (train.dtype: bfloat16 runs without it); allowed: train.dtype: "
              "float32");
}

void MemoryTargetFront::mark(std::optional<StepEventKey> next) {
  const int64_t peak = TrackingAllocator::instance().takeEventPeak();
  if (open_) target_->record(*open_, peak);
  open_ = std::move(next);
}

void MemoryTargetFront::say(const std::vector<StepMessage>& messages) const {
  for (const StepMessage& m : messages) {
    if (log_) log_(m.warning, m.text);
  }
}

void MemoryTargetFront::stepBegin() {
  mark(std::nullopt);
  say(target_->finishStep(/*fragmentation_bytes=*/0));
  TORCH_CHECK(target_->error().empty(), target_->error());
  target_->startStep(TrackingAllocator::instance().currentBytes());
  if (target_->wantsFirstPlan()) {
    if (target_->regionsReady()) {  // else a layer has not finished its profile: plan at the next step
      target_->prepareFirstPlan();
      say(target_->plan());
    }
  } else if (target_->plannedAt() != 0 && target_->needsReplan()) {
    say(target_->plan("a step's measured peak went over its prediction"));
  }
  TORCH_CHECK(target_->error().empty(), target_->error());
  mark(StepEventKey{"before the layers", 0, -1});
}

void MemoryTargetFront::stepDone() {
  mark(std::nullopt);
  say(target_->finishStep(/*fragmentation_bytes=*/0));  // the step's history row now; nothing counted until the next
}

void MemoryTargetFront::hookBackward(const at::Tensor& t, StepEventKey event) {
  if (!t.defined() || !t.requires_grad()) return;
  std::weak_ptr<MemoryTargetFront> self = weak_from_this();
  t.register_hook([self, event](const at::TensorBase&) {
    if (auto front = self.lock()) front->mark(event);
  });
}

void MemoryTargetFront::layerBegin(int64_t i, const std::vector<at::Tensor>& inputs) {
  target_->layerCalled(i);
  mark(StepEventKey{"forward of layer " + std::to_string(i), i + 1, i});
  if (i == 0 && !inputs.empty()) hookBackward(inputs[0], StepEventKey{kStepRest, 0, -1});
}

void MemoryTargetFront::layerEnd(int64_t i, const std::vector<at::Tensor>& outputs) {
  mark(StepEventKey{i == layers_ - 1 ? "after the layers" : "after layer " + std::to_string(i), i + 1, -1});
  if (!outputs.empty()) hookBackward(outputs[0], StepEventKey{"backward of layer " + std::to_string(i), i, i});
}

bool MemoryTargetFront::checkpointed(int64_t i) const { return target_->layerPlans().at(i).checkpointed; }

}  // namespace hpac::trainer
