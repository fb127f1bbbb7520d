#include "replay/tracking_allocator.h"

#include <c10/core/CPUAllocator.h>
#include <c10/util/Exception.h>

#include <mutex>

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

namespace {

thread_local int outputs_only_depth = 0;  // Note [A meta op holds its outputs]

// Note [Meta tensors are counted] (tracking_allocator.h).
class MetaCounter final : public c10::Allocator {
 public:
  c10::DataPtr allocate(size_t nbytes) HPAC_ALLOCATOR_CONST override {
    const auto bytes = static_cast<int64_t>(nbytes);
    const c10::Device meta(c10::DeviceType::Meta);
    if (bytes == 0) return c10::DataPtr(nullptr, nullptr, nullptr, meta);
    TrackingAllocator& t = TrackingAllocator::instance();
    if (outputs_only_depth > 0) {
      t.countWithoutPeak(bytes);
    } else {
      t.count(bytes);
    }
    return c10::DataPtr(nullptr, new int64_t(bytes), &TrackingAllocator::releaseMeta, meta);
  }
#if HPAC_TORCH_AT_LEAST(2, 3)
  void copy_data(void* /*dest*/, const void* /*src*/, std::size_t /*count*/) const override {}
#endif
};

MetaCounter* meta_counter = nullptr;

}  // namespace

bool TrackingAllocator::trackMeta(bool on) {
  std::lock_guard<std::mutex> lock(instance().install_mutex_);
  static c10::Allocator* before = nullptr;  // the meta allocator trackMeta(true) replaced
  const bool was = metaTracked();
  if (on && !was) {
    if (meta_counter == nullptr) meta_counter = new MetaCounter();  // leaked: meta tensors may outlive statics
    before = c10::GetAllocator(c10::DeviceType::Meta);
    c10::SetAllocator(c10::DeviceType::Meta, meta_counter, /*priority=*/1);
  } else if (!on && was && before != nullptr) {
    c10::SetAllocator(c10::DeviceType::Meta, before, /*priority=*/1);
  }
  return was;
}

bool TrackingAllocator::metaTracked() {
  return meta_counter != nullptr && c10::GetAllocator(c10::DeviceType::Meta) == meta_counter;
}

void TrackingAllocator::releaseMeta(void* context) {
  auto* bytes = static_cast<int64_t*>(context);
  tracker_instance->count(-*bytes);
  delete bytes;
}

TrackingAllocator::OutputsOnly::OutputsOnly() {
  ++outputs_only_depth;
}

TrackingAllocator::OutputsOnly::~OutputsOnly() {
  if (--outputs_only_depth == 0) instance().raisePeaks(instance().currentBytes());  // the peaks take the outputs
}

void TrackingAllocator::countWithoutPeak(int64_t bytes) const {
  current_.fetch_add(bytes, std::memory_order_relaxed);
  if (bytes > 0) allocations_.fetch_add(1, std::memory_order_relaxed);
}

void TrackingAllocator::raisePeaks(int64_t now) const {
  for (std::atomic<int64_t>* counter : {&peak_, &event_peak_, &op_peak_}) {
    int64_t peak = counter->load(std::memory_order_relaxed);
    while (now > peak && !counter->compare_exchange_weak(peak, now, std::memory_order_relaxed)) {
    }
  }
}

void TrackingAllocator::count(int64_t bytes) const {
  const int64_t now = current_.fetch_add(bytes, std::memory_order_relaxed) + bytes;
  if (bytes < 0) return;
  raisePeaks(now);
  allocations_.fetch_add(1, std::memory_order_relaxed);
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
  count(bytes);
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
