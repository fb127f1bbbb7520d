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

const RegionState& currentRegion() {
  return tls_region;
}

RegionGuard::RegionGuard(Invocation& invocation, Phase phase)
    : include_(checkedKey(invocation)), previous_(tls_region), uncaught_at_entry_(std::uncaught_exceptions()) {
  invocation.beginPhase(phase);
  tls_region = RegionState{&invocation, phase};
}

// Note [Ending a region can fail]
void RegionGuard::end() {
  if (ended_) return;
  ended_ = true;
  struct Leave {
    const RegionState& previous;
    ~Leave() { tls_region = previous; }
  } leave{previous_};
  tls_region.invocation->endPhase(!abandoned_ && std::uncaught_exceptions() <= uncaught_at_entry_);
}

RegionGuard::~RegionGuard() {
  try {
    end();
  } catch (const std::exception& e) {
    if (std::uncaught_exceptions() <= uncaught_at_entry_) {
      TORCH_WARN("hpac: ending a checkpoint region failed and the error cannot leave a destructor: ", e.what(),
                 " (call RegionGuard::end() where the region's code returns to receive it)");
    }
  }
}

}  // namespace hpac
