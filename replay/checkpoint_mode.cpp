#include "replay/checkpoint_mode.h"

#include "policy/selective_policy.h"

#include <c10/util/Exception.h>
#include <c10/util/StringUtil.h>

namespace hpac {

const std::vector<std::string>& checkpointModeNames() {
  static const std::vector<std::string> names = {"off", "full", "selective", "budget"};
  return names;
}

const char* toString(CheckpointMode mode) {
  const size_t i = static_cast<size_t>(mode);
  return i < checkpointModeNames().size() ? checkpointModeNames()[i].c_str() : "?";
}

bool parseCheckpointMode(const std::string& name, CheckpointMode* mode) {
  const std::vector<std::string>& names = checkpointModeNames();
  for (size_t i = 0; i < names.size(); ++i) {
    if (name == names[i]) {
      *mode = static_cast<CheckpointMode>(i);
      return true;
    }
  }
  return false;
}

CheckpointMode checkpointModeOrThrow(const std::string& name) {
  CheckpointMode mode;
  TORCH_CHECK(parseCheckpointMode(name, &mode), "unknown activation checkpoint mode '", name,
              "'; allowed: ", c10::Join(", ", checkpointModeNames()));
  return mode;
}

CheckpointOptions checkpointOptionsFor(CheckpointMode mode) {
  TORCH_CHECK(mode != CheckpointMode::kOff,
              "hpac: checkpoint mode 'off' has no checkpoint options; run the function without hpac::checkpoint");
  TORCH_CHECK(mode != CheckpointMode::kBudget,
              "hpac: checkpoint mode 'budget' needs a budget: give the checkpoint a BudgetRegion's factory() "
              "(policy/budget_policy.h) as its policy");
  CheckpointOptions options;
  if (mode == CheckpointMode::kSelective) options.policy = selectivePolicy();
  return options;
}

}  // namespace hpac
