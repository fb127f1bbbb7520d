// hpac/replay/phase.h
//
// Phase: which pass of a checkpoint region an op belongs to. The forward runs
// every op and keeps the outputs the policy saves; the recompute (in backward)
// serves those outputs and re-runs the rest. Op occurrences are counted per
// phase, so the n-th mm of the recompute meets the n-th mm of the forward.
#pragma once

#include <cstdint>

namespace hpac {

enum class Phase : uint8_t { kForward = 0, kRecompute = 1 };

inline const char* toString(Phase phase) {
  return phase == Phase::kForward ? "forward" : "recompute";
}

}  // namespace hpac
