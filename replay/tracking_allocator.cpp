#include "replay/tracking_allocator.h"

#include <c10/core/CPUAllocator.h>
#include <c10/util/Exception.h>

namespace hpac {
namespace {

struct Allocation {
  c10::DataPtr inner;
  int64_t bytes;
  const TrackingAllocator* owner;
};

}  // namespace

TrackingAllocator& TrackingAllocator::install() {
  static TrackingAllocator* tracker = [] {
    auto* t = new TrackingAllocator(c10::GetCPUAllocator());  // leaked: tensors may outlive statics
    // Priority above the default registration so that no later default-priority set replaces it.
    c10::SetCPUAllocator(t, /*priority=*/1);
    return t;
  }();
  return *tracker;
}

c10::DataPtr TrackingAllocator::allocate(size_t nbytes) const {
  if (fail_countdown_.load(std::memory_order_relaxed) > 0 && fail_countdown_.fetch_sub(1) == 1) {
    TORCH_CHECK(false, "TrackingAllocator: simulated out of memory allocating ", nbytes, " bytes");
  }
  c10::DataPtr inner = inner_->allocate(nbytes);
  void* data = inner.get();
  const c10::Device device = inner.device();
  const auto bytes = static_cast<int64_t>(nbytes);
  const int64_t now = current_.fetch_add(bytes, std::memory_order_relaxed) + bytes;
  int64_t peak = peak_.load(std::memory_order_relaxed);
  while (now > peak && !peak_.compare_exchange_weak(peak, now, std::memory_order_relaxed)) {
  }
  allocations_.fetch_add(1, std::memory_order_relaxed);
  auto* ctx = new Allocation{std::move(inner), bytes, this};
  return c10::DataPtr(data, ctx, &TrackingAllocator::release, device);
}

void TrackingAllocator::release(void* ctx) {
  auto* a = static_cast<Allocation*>(ctx);
  a->owner->current_.fetch_sub(a->bytes, std::memory_order_relaxed);
  delete a;  // frees the memory through the inner allocator's deleter
}

}  // namespace hpac
