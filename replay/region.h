// hpac/replay/region.h
//
// The checkpoint region: thread-local state that says which invocation and
// phase the ops on this thread belong to, switched on and off only by
// RegionGuard. While no guard is alive on a thread, dispatchKey() is not in that
// thread's TLS include set and no hpac code runs for its ops.
#pragma once

#include "replay/phase.h"

#include <c10/core/impl/LocalDispatchKeySet.h>

#include <exception>

namespace hpac {

class Invocation;

struct RegionState {
  Invocation* invocation = nullptr;
  Phase phase = Phase::kForward;
};

// The region active on this thread (invocation == nullptr outside regions).
const RegionState& currentRegion();

// RegionGuard
//
// RAII: makes `invocation` the active region of this thread in `phase` and puts
// dispatchKey() into the TLS include set; the destructor restores both exactly,
// also when the region is left by an exception. Regions do not nest: entering
// one while another is active on the thread throws c10::Error naming both
// invocations. Throws if the fallback is not registered (fallbackStatus()).
class RegionGuard {
 public:
  RegionGuard(Invocation& invocation, Phase phase);
  ~RegionGuard();
  RegionGuard(const RegionGuard&) = delete;
  RegionGuard& operator=(const RegionGuard&) = delete;

  // Marks the phase as ended by an error in code the guard cannot see (a
  // Python exception on its way through a context manager); an exception
  // thrown through the guard itself is noticed without it.
  void abandon() { abandoned_ = true; }
  // Note [Ending a region can fail]
  // Ending a phase runs code that may throw: a forward hands what it keeps to
  // the saved-tensor hooks around it (Note [Outer saved-tensor hooks]), whose
  // Python pack may raise; a budget's policy plans. end() ends the phase now
  // and throws what that threw, with the region left and the invocation
  // consistent (the phase counted as not completed). Call it where the region's
  // code returned normally; the destructor ends a phase not ended yet (the
  // unwinding path) and, being noexcept, drops what ending throws then: the
  // error already on its way wins.
  void end();

 private:
  c10::impl::IncludeDispatchKeyGuard include_;
  RegionState previous_;
  int uncaught_at_entry_;
  bool abandoned_ = false;
  bool ended_ = false;
};

}  // namespace hpac
