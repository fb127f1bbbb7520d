// hpac/replay/checkpoint_mode.h
//
// CheckpointMode: the product's vocabulary for how much of a region to keep,
// shared by the trainer's YAML (activation_checkpoint.mode), hpac-train and
// hpac-demo flags, the Python integration and the tests:
//   off        no checkpoint: the function runs plainly, autograd keeps everything
//   full       checkpoint, recompute every op in backward (no policy)
//   selective  checkpoint with the built-in selective policy (policy/selective_policy.h)
//   budget     checkpoint with the memory-budget policy (policy/budget_policy.h): profile, plan
//              within a budget, replay; needs a budget (a BudgetRegion per region)
#pragma once

#include "replay/checkpoint.h"

#include <string>
#include <vector>

namespace hpac {

enum class CheckpointMode : uint8_t { kOff, kFull, kSelective, kBudget };

const char* toString(CheckpointMode mode);

// Every mode name, in declaration order ("off", "full", "selective", "budget").
const std::vector<std::string>& checkpointModeNames();

// Parses a mode name; false if `name` is none of checkpointModeNames().
bool parseCheckpointMode(const std::string& name, CheckpointMode* mode);

// Parses a mode name; throws c10::Error naming the value and the allowed names.
CheckpointMode checkpointModeOrThrow(const std::string& name);

// The options of one checkpoint call in `mode` (kFull: no policy; kSelective:
// selectivePolicy()). kOff has none — the caller runs the function without
// hpac::checkpoint — and throws c10::Error; so does kBudget, whose policy is a
// region's (BudgetRegion::factory(), policy/budget_policy.h), not a mode's.
CheckpointOptions checkpointOptionsFor(CheckpointMode mode);

}  // namespace hpac
