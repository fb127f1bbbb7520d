// hpac/replay/tracking_allocator.h
//
// TrackingAllocator: a CPU allocator that wraps the one installed before it
// and counts live and peak tensor bytes. Tensors do not go through operator
// new, so this is how hpac's tests and benchmarks measure activation memory.
// Install it before the tensors you want to count are allocated; tensors
// allocated earlier are freed through their original deleter and not counted.
//
// Thread safety: counters are atomics; allocate/free may run on any thread.
#pragma once

#include "replay/torch_compat.h"

#include <c10/core/Allocator.h>

#include <atomic>
#include <cstdint>
#include <mutex>
#include <unordered_map>
#include <vector>

namespace hpac {

// Note [Meta tensors are counted]
// A meta tensor has a storage of nbytes and no data: ops on it run shape
// functions only. hpac plans a step for a device it does not have by running
// the step on the meta device (hpac.plan, plugin/python/hpac/_plan.py), and
// reads that step's memory exactly as on CPU: trackMeta() puts an allocator
// on the meta device whose DataPtr holds no data and a context with the
// storage's size, and allocate/free count into the same counters (current,
// peak, the event and op peaks) as CPU tensors. What a meta storage grows by
// without its allocator (resize_ of a meta tensor sets nbytes) is not seen;
// the ops a step runs allocate their outputs.
//
// Note [The tracker is installed while asked for]
// Every CPU allocation through the tracker takes its mutex and a map insert,
// so it is the CPU allocator only while someone asked for it: install() (the
// Python track_memory(), hpac-train's memory columns, the benchmarks) for the
// rest of the process, a Scope (explain's memory timeline) while the Scope
// lives, after which the allocator it wrapped is the CPU allocator again.
// Tensors it allocated are freed through it whenever they die, so its counts
// stay right across installs; tensors allocated while it was not installed
// are never counted. instance() reads the counters without installing.
class TrackingAllocator final : public c10::Allocator {
 public:
  // Installs the process-wide tracker over the current CPU allocator for the
  // rest of the process (once) and returns it.
  static TrackingAllocator& install();
  // The process-wide tracker, created (not installed) on first use.
  static TrackingAllocator& instance();
  // Whether the tracker is the CPU allocator now.
  static bool installed();
  // Note [Meta tensors are counted]: on, installs a meta-device allocator whose allocations (no data; their
  // bytes) count in this tracker's counters as CPU ones do; off, puts back the allocator it replaced (meta
  // tensors it made still count until freed). Returns whether it was on: hpac.plan turns it on for its steps and
  // back as it found it.
  static bool trackMeta(bool on = true);
  static bool metaTracked();
  // The meta allocator's deleter (its context: the storage's bytes).
  static void releaseMeta(void* context);
  // The counters' side of an allocation of `bytes` (and of its free: -bytes).
  void count(int64_t bytes) const;
  void countWithoutPeak(int64_t bytes) const;  // Note [A meta op holds its outputs]
  void raisePeaks(int64_t now) const;            // every peak becomes at least `now`
  // Note [A meta op holds its outputs]
  // A meta function may be a decomposition (torch's Python meta functions
  // for _log_softmax and others compute through intermediates), which a
  // kernel on a device does not allocate: while an OutputsOnly lives on this
  // thread, meta allocations count in the current bytes but raise no peak;
  // when it ends, the peaks take the current bytes (the op's outputs). hpac's
  // fallback puts one around each meta op of a planned step (hpac.plan puts
  // the key around the whole step; plugin/fallback.cpp). CPU allocations are
  // counted as always.
  class OutputsOnly {
   public:
    OutputsOnly();
    ~OutputsOnly();
    OutputsOnly(const OutputsOnly&) = delete;
    OutputsOnly& operator=(const OutputsOnly&) = delete;
  };
  // The tracker is the CPU allocator while a Scope lives (or for good after
  // install()); the allocator it wraps is put back when the last Scope ends.
  class Scope {
   public:
    Scope();
    ~Scope();
    Scope(const Scope&) = delete;
    Scope& operator=(const Scope&) = delete;
  };

  int64_t currentBytes() const { return current_.load(std::memory_order_relaxed); }
  int64_t peakBytes() const { return peak_.load(std::memory_order_relaxed); }
  int64_t allocations() const { return allocations_.load(std::memory_order_relaxed); }
  // Sets the peak to the current value.
  void resetPeak() { peak_.store(currentBytes(), std::memory_order_relaxed); }
  // A second peak, the whole-step memory target's own (plugin/python/hpac/_target.py): the peak since the last
  // take, which then starts again from the current value. resetPeak() does not touch it, so a caller's own peak
  // readings and the target's events do not disturb each other.
  int64_t takeEventPeak() {
    return event_peak_.exchange(currentBytes(), std::memory_order_relaxed);
  }
  // A third, the budget profile's (Note [A forward, op by op], policy/budget_policy.cpp): the peak since the last
  // take, op by op.
  int64_t takeOpPeak() { return op_peak_.exchange(currentBytes(), std::memory_order_relaxed); }

  // Timeline (explain, replay/explain.h): while set, the bytes alive after
  // every allocation and free are appended to `*out` (TimelineCapture owns
  // it). nullptr stops.
  void setTimeline(std::vector<int64_t>* out) {
    std::lock_guard<std::mutex> lock(mutex_);
    timeline_ = out;
  }

  // Fault injection: the `n`-th allocation from now (n >= 1) throws c10::Error
  // ("simulated out of memory"), as a real allocator does when memory runs
  // out. failAfter(0) disarms.
  void failAfter(int64_t n) { fail_countdown_.store(n, std::memory_order_relaxed); }

  c10::DataPtr allocate(size_t nbytes) HPAC_ALLOCATOR_CONST override;
#if HPAC_TORCH_AT_LEAST(2, 3)
  void copy_data(void* dest, const void* src, std::size_t count) const override {
    default_copy_data(dest, src, count);
  }
#endif
  // The DataPtr's context is its data pointer (what Allocator::raw_allocate
  // requires: GELU's CPU kernel and bfloat16 mm use it), so the inner
  // allocation and its size live in a side table keyed by that pointer.
  c10::DeleterFnPtr raw_deleter() const override { return &TrackingAllocator::release; }

 private:
  explicit TrackingAllocator(c10::Allocator* inner) : inner_(inner) {}
  static void release(void* data);

  void acquire(bool for_good);
  void releaseScope();

  c10::Allocator* inner_;
  int scopes_ = 0;         // guarded by install_mutex_
  bool for_good_ = false;  // guarded by install_mutex_
  std::mutex install_mutex_;
  mutable std::atomic<int64_t> current_{0};
  mutable std::atomic<int64_t> peak_{0};
  mutable std::atomic<int64_t> event_peak_{0};
  mutable std::atomic<int64_t> op_peak_{0};
  mutable std::atomic<int64_t> allocations_{0};
  mutable std::atomic<int64_t> fail_countdown_{0};
  struct Live {
    c10::DataPtr inner;
    int64_t bytes;
  };
  mutable std::mutex mutex_;
  mutable std::unordered_map<void*, Live> live_;
  std::vector<int64_t>* timeline_ = nullptr;  // guarded by mutex_
};

}  // namespace hpac
