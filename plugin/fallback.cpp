// hpac's boxed fallback: admit the op, run it below the key (unless it is
// served from the forward's storage), fix up its outputs. The decisions live in
// policy/, counting, storage and serving in replay/Invocation; this file only
// sequences them.
//
// The fallback is reachable while a RegionGuard has put the key into the
// thread's TLS include set, so outside a region it is not called, with two
// exceptions: a tensor that carries the key itself (another user of the key),
// whose ops pass below the key untouched; and hpac.plan's steps on the meta
// device, during which setMetaOpsInRegions keeps the key in the planning
// thread's include set so that every meta op's outputs count without raising a
// peak (Note [A meta op holds its outputs]); hpac.plan turns it off again when
// its steps end, even when they raise.
#include "plugin/fallback.h"

#include "replay/tracking_allocator.h"

#include <atomic>
#include <memory>
#include <optional>

#include "replay/dispatch_key.h"
#include "replay/invocation.h"
#include "replay/op_cost.h"
#include "replay/region.h"

#include <c10/core/impl/LocalDispatchKeySet.h>
#include <c10/macros/Macros.h>

#include <chrono>
#include <optional>

namespace hpac {
namespace {

thread_local uint64_t tls_fallback_entries = 0;
std::atomic<bool> meta_ops_in_regions{false};

// Note [Profiles wait for the device]
// An accelerator's op returns once its kernel is queued, so a host clock
// around it measures the launch. While an op is timed (a budget profile,
// explain's recorder) the stream of the device its first tensor argument lives
// on is synchronised before and after it: the time is the kernel's, the
// device otherwise runs ahead as usual. CPU ops need nothing.
std::optional<c10::Device> acceleratorOf(const c10::OperatorHandle& op, const torch::jit::Stack& stack) {
  const size_t num_args = op.schema().arguments().size();
  for (size_t i = stack.size() - num_args; i < stack.size(); ++i) {
    const c10::IValue& v = stack[i];
    if (v.isTensor() && v.toTensor().defined() && !v.toTensor().is_cpu() && !v.toTensor().is_meta()) {
      return v.toTensor().device();
    }
  }
  return std::nullopt;
}

// Note [Redispatch below hpac]
// Two things must hold when an op continues below hpac's key:
//  1. this call skips the key: a keyset redispatch with everything after the
//     key (ks & FULL_AFTER(key)) — not callBoxed, which would recompute the
//     keyset from TLS and land on the fallback again;
//  2. ops the kernel calls internally (the CPU addmm kernel's empty/resize,
//     softmax's empty_like, composite kernels below autograd) are not hpac's
//     business: they are not part of the region's op sequence seen by autograd,
//     so counting them would make occurrence indices depend on kernel
//     internals, and serving them from cache would be wrong. An
//     ExcludeDispatchKeyGuard for the key around the call hides every nested op.
// The exclude guard alone would do for 2., the keyset alone for 1.; both are
// cheap TLS/bit operations.
void runBelowHpac(const c10::OperatorHandle& op, c10::DispatchKeySet ks, torch::jit::Stack* stack) {
  const c10::DispatchKey key = dispatchKey();
  c10::impl::ExcludeDispatchKeyGuard hide_nested(key);
  // Note [A meta op holds its outputs]: while hpac.plan steps on the meta device, what the meta function allocates
  // and frees inside the op does not raise the peaks; its outputs do, once it returns.
  std::optional<TrackingAllocator::OutputsOnly> outputs_only;
  if (C10_UNLIKELY(ks.has_backend(c10::BackendComponent::MetaBit)) &&
      meta_ops_in_regions.load(std::memory_order_relaxed)) {
    outputs_only.emplace();
  }
  op.redispatchBoxed(ks & c10::DispatchKeySet(c10::DispatchKeySet::FULL_AFTER, key), stack);
}

}  // namespace

void hpacFallback(const c10::OperatorHandle& op, c10::DispatchKeySet ks, torch::jit::Stack* stack) {
  ++tls_fallback_entries;
  const RegionState& region = currentRegion();
  if (C10_UNLIKELY(region.invocation == nullptr)) {
    runBelowHpac(op, ks, stack);
    return;
  }
  // Note [Meta ops are not the region's]
  // Ops on the meta device compute nothing: they are shape propagation by
  // tensor subclasses (DTensor's sharding propagation runs meta ops on a cache
  // miss, so the first detach of a DTensor parameter in a recompute ran
  // aten::empty_strided on meta that the forward never ran, and the replay
  // failed), fake tensors, or deferred initialisation. Counting them would make
  // occurrence indices depend on a cache; they run below the key untouched.
  // hpac.plan turns this off while it runs a step on the meta device, where every op is meta and is the step's
  // (setMetaOpsInRegions).
  if (C10_UNLIKELY(ks.has_backend(c10::BackendComponent::MetaBit)) &&
      !meta_ops_in_regions.load(std::memory_order_relaxed)) {
    runBelowHpac(op, ks, stack);
    return;
  }
  Invocation& invocation = *region.invocation;
  const Invocation::Admission admission = invocation.admit(region.phase, op, *stack);
  // A budget profile or explain's recorder: the op is timed and reported (Invocation::timing()).
  if (C10_UNLIKELY(invocation.timing())) {
    invocation.observeArguments(op, *stack);
    const std::optional<c10::Device> device = acceleratorOf(op, *stack);
    if (device) waitForDevice(*device);
    const auto start = std::chrono::steady_clock::now();
    invocation.perform(admission, op, stack, [&] { runBelowHpac(op, ks, stack); });
    if (device) waitForDevice(*device);
    const auto nanos = std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - start);
    invocation.observe(admission, op, *stack, nanos.count());
  } else {
    invocation.perform(admission, op, stack, [&] { runBelowHpac(op, ks, stack); });
  }
  if (region.phase == Phase::kForward) invocation.noteProduced(admission, op, *stack);  // Note [State written twice]
}

// Note [A meta op holds its outputs]: the key stays in this thread's include set while a planned step runs, so that
// every op reaches runBelowHpac, inside a region or not.
thread_local std::unique_ptr<c10::impl::IncludeDispatchKeyGuard> meta_step_include;

bool setMetaOpsInRegions(bool on) {
  const bool was = meta_ops_in_regions.exchange(on);
  if (on && !meta_step_include) meta_step_include = std::make_unique<c10::impl::IncludeDispatchKeyGuard>(dispatchKey());
  if (!on) meta_step_include.reset();
  return was;
}

uint64_t fallbackEntriesOnThisThread() {
  return tls_fallback_entries;
}

}  // namespace hpac
