// hpac's boxed fallback. Kept small on purpose: the policy lives in policy/,
// counting, storage and serving in replay/Invocation.
//
// The fallback is only reachable while a RegionGuard has put the key into the
// thread's TLS include set, so "no region" means "never called". The one
// exception is a tensor that carries the key itself (another user of the key);
// such ops are passed below the key untouched.
#include "plugin/fallback.h"

#include "replay/invocation.h"
#include "replay/region.h"

#include <c10/macros/Macros.h>

namespace hpac {
namespace {

thread_local uint64_t tls_fallback_entries = 0;

}  // namespace

void hpacFallback(const c10::OperatorHandle& op, c10::DispatchKeySet ks, torch::jit::Stack* stack) {
  ++tls_fallback_entries;
  const RegionState& region = currentRegion();
  if (C10_UNLIKELY(region.invocation == nullptr)) {
    runBelowHpac(op, ks, stack);
    return;
  }
  // Redispatch style: see Note [Redispatch below hpac] in replay/region.cpp.
  region.invocation->handle(region.phase, op, ks, stack);
}

uint64_t fallbackEntriesOnThisThread() {
  return tls_fallback_entries;
}

}  // namespace hpac
