// hpac/tools/explain/explain_moe.h
//
// Explain on the demo's model: a stack of MoeBlocks (tools/moe_block.h), each
// block one checkpoint region. One training step per mode (off, full,
// selective, budget) with its memory timeline captured; in the explained
// mode, the chosen block's invocation records every op (replay/explain.h).
// The budget mode first runs one profile step (policy/budget_policy.h), then
// the step that is explained.
#pragma once

#include "replay/explain.h"

#include <cstdint>
#include <string>
#include <vector>

namespace hpac {

// "off", "full", "selective", "budget": the timeline's modes, in order.
const std::vector<std::string>& explainModeNames();
// Throws c10::Error naming `mode` and the allowed names; `explained` also
// refuses "off" (no region is checkpointed, nothing to explain).
void checkExplainMode(const std::string& mode, bool explained);

struct MoeExplainOptions {
  int64_t blocks = 2;
  int64_t region = 0;          // the block explained, in [0, blocks)
  std::string mode = "selective";
  double budget = 0.5;         // budget mode: fraction of what the region keeps under off
  int64_t batch = 2, seq = 16;
  uint64_t seed = 0;
  std::vector<std::string> timeline_modes = explainModeNames();
};

// Validates the options (errors name the value and what is allowed) and runs.
ExplainReport explainMoeBlocks(const MoeExplainOptions& options);

}  // namespace hpac
