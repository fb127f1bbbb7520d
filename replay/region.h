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

 private:
  c10::impl::IncludeDispatchKeyGuard include_;
  RegionState previous_;
  int uncaught_at_entry_;
  bool abandoned_ = false;
};

}  // namespace hpac
