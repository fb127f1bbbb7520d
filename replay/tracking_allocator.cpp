#include "replay/tracking_allocator.h"

#include <c10/core/CPUAllocator.h>
#include <c10/util/Exception.h>

namespace hpac {
namespace {

TrackingAllocator* tracker_instance = nullptr;

}  // namespace

TrackingAllocator& TrackingAllocator::instance() {
  static TrackingAllocator* tracker = [] {
    auto* t = new TrackingAllocator(c10::GetCPUAllocator());  // leaked: tensors may outlive statics
    tracker_instance = t;
    return t;
  }();
  return *tracker;
}

// Note [The tracker is installed while asked for]
void TrackingAllocator::acquire(bool for_good) {
  std::lock_guard<std::mutex> lock(install_mutex_);
  if (for_good && for_good_) return;
  if (!for_good_ && scopes_ == 0) {
    // Priority above the default registration so that no later default-priority set replaces it meanwhile.
    c10::SetCPUAllocator(this, /*priority=*/1);
  }
  if (for_good) {
    for_good_ = true;
  } else {
    ++scopes_;
  }
}

void TrackingAllocator::releaseScope() {
  std::lock_guard<std::mutex> lock(install_mutex_);
  if (--scopes_ == 0 && !for_good_ && c10::GetCPUAllocator() == this) c10::SetCPUAllocator(inner_, /*priority=*/1);
}

TrackingAllocator& TrackingAllocator::install() {
  TrackingAllocator& t = instance();
  t.acquire(/*for_good=*/true);
  return t;
}

bool TrackingAllocator::installed() {
  return c10::GetCPUAllocator() == &instance();
}

TrackingAllocator::Scope::Scope() {
  instance().acquire(/*for_good=*/false);
}

TrackingAllocator::Scope::~Scope() {
  instance().releaseScope();
}

c10::DataPtr TrackingAllocator::allocate(size_t nbytes) HPAC_ALLOCATOR_CONST {
  if (fail_countdown_.load(std::memory_order_relaxed) > 0 && fail_countdown_.fetch_sub(1) == 1) {
    TORCH_CHECK(false, "TrackingAllocator: simulated out of memory allocating ", nbytes, " bytes");
  }
  c10::DataPtr inner = inner_->allocate(nbytes);
  void* data = inner.get();
  const c10::Device device = inner.device();
  const auto bytes = static_cast<int64_t>(nbytes);
  const int64_t now = current_.fetch_add(bytes, std::memory_order_relaxed) + bytes;
  for (std::atomic<int64_t>* counter : {&peak_, &event_peak_, &op_peak_}) {
    int64_t peak = counter->load(std::memory_order_relaxed);
    while (now > peak && !counter->compare_exchange_weak(peak, now, std::memory_order_relaxed)) {
    }
  }
  allocations_.fetch_add(1, std::memory_order_relaxed);
  if (data == nullptr) return c10::DataPtr(nullptr, nullptr, nullptr, device);  // zero bytes
  {
    std::lock_guard<std::mutex> lock(mutex_);
    live_.emplace(data, Live{std::move(inner), bytes});
    if (timeline_ != nullptr) timeline_->push_back(current_.load(std::memory_order_relaxed));
  }
  return c10::DataPtr(data, data, &TrackingAllocator::release, device);
}

void TrackingAllocator::release(void* data) {
  TrackingAllocator* t = tracker_instance;
  Live live;
  {
    std::lock_guard<std::mutex> lock(t->mutex_);
    auto it = t->live_.find(data);
    if (it == t->live_.end()) {
      // Raw memory allocated before the tracker was installed (oneDNN keeps
      // such buffers) but freed through the current CPU allocator's
      // raw_deleter(): hand it back to the allocator that made it.
      if (c10::DeleterFnPtr inner_delete = t->inner_->raw_deleter()) inner_delete(data);
      return;
    }
    live = std::move(it->second);
    t->live_.erase(it);
    if (t->timeline_ != nullptr) t->timeline_->push_back(t->current_.load(std::memory_order_relaxed) - live.bytes);
  }
  t->current_.fetch_sub(live.bytes, std::memory_order_relaxed);
  // live.inner frees the memory through the inner allocator's deleter here.
}

}  // namespace hpac
