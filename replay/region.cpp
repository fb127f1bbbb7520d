#include "replay/region.h"

#include "replay/dispatch_key.h"
#include "replay/invocation.h"

#include <c10/util/Exception.h>

namespace hpac {
namespace {

thread_local RegionState tls_region;

c10::DispatchKey checkedKey(const Invocation& invocation) {
  checkFallbackRegistered();
  const RegionState& active = tls_region;
  TORCH_CHECK(active.invocation == nullptr,
              "hpac: checkpoint regions do not nest: invocation ", invocation.id(),
              " was entered while invocation ", active.invocation ? active.invocation->id() : 0, " (",
              toString(active.phase),
              ") is active on this thread. Checkpoint either the outer or the inner function, not both.");
  return dispatchKey();
}

}  // namespace

const char* toString(Phase phase) {
  return phase == Phase::kForward ? "forward" : "recompute";
}

const RegionState& currentRegion() {
  return tls_region;
}

RegionGuard::RegionGuard(Invocation& invocation, Phase phase)
    : include_(checkedKey(invocation)), previous_(tls_region) {
  invocation.beginPhase(phase);
  tls_region = RegionState{&invocation, phase};
}

RegionGuard::~RegionGuard() {
  tls_region.invocation->endPhase();
  tls_region = previous_;
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
  op.redispatchBoxed(ks & c10::DispatchKeySet(c10::DispatchKeySet::FULL_AFTER, key), stack);
}

}  // namespace hpac
