#include "tools/trainer/memory_target.h"

#include "replay/tracking_allocator.h"

#include <c10/util/Exception.h>

#include <utility>

namespace hpac::trainer {

namespace {

int64_t takePeak() { return TrackingAllocator::instance().takeEventPeak(); }

}  // namespace

MemoryTargetFront::MemoryTargetFront(std::unique_ptr<StepTarget> target, Log log)
    : driver_(std::move(target)), log_(std::move(log)) {
  TORCH_CHECK(TrackingAllocator::installed(), "hpac-train: activation_checkpoint.memory_target reads hpac's tracking "
              "allocator, which is not installed (train.dtype: bfloat16 runs without it); allowed: train.dtype: "
              "float32");
}

void MemoryTargetFront::say(const std::vector<StepMessage>& messages) const {
  for (const StepMessage& m : messages) {
    if (log_) log_(m.warning, m.text);
  }
}

void MemoryTargetFront::stepBegin() {
  const int64_t peak = takePeak();
  say(driver_.stepBegins(peak, TrackingAllocator::instance().currentBytes(), /*fragmentation=*/0));
  TORCH_CHECK(driver_.error().empty(), driver_.error());
  say(driver_.beforeLayers(takePeak()));
  TORCH_CHECK(driver_.error().empty(), driver_.error());
}

void MemoryTargetFront::optimizerBegins() {
  driver_.optimizerBegins(takePeak(), TrackingAllocator::instance().currentBytes());
}

void MemoryTargetFront::stepDone() {
  say(driver_.stepEnds(takePeak(), /*fragmentation=*/0, TrackingAllocator::instance().currentBytes()));
}

template <typename Mark>
void MemoryTargetFront::hookBackward(const at::Tensor& t, Mark mark) {
  if (!t.defined() || !t.requires_grad()) return;
  std::weak_ptr<MemoryTargetFront> self = weak_from_this();
  t.register_hook([self, mark](const at::TensorBase&) {
    if (auto front = self.lock()) mark(front->driver_, takePeak());
  });
}

void MemoryTargetFront::layerBegin(int64_t i, const std::vector<at::Tensor>& inputs) {
  driver_.forwardBegins(i, takePeak());
  if (i == 0 && !inputs.empty()) hookBackward(inputs[0], [](StepDriver& d, int64_t peak) { d.restBegins(peak); });
}

void MemoryTargetFront::layerEnd(int64_t i, const std::vector<at::Tensor>& outputs) {
  driver_.forwardEnds(i, takePeak());
  if (!outputs.empty()) hookBackward(outputs[0], [i](StepDriver& d, int64_t peak) { d.backwardBegins(i, peak); });
}

}  // namespace hpac::trainer
