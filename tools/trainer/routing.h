// hpac/tools/trainer/routing.h
//
// Model preparation, the C++ front end of the route planner (route_plan.h, which
// holds every rule): discover the zoo model's layers, gather the facts
// (trainable, native, the checkpoint seam, child names, the config's KV
// sharing), plan, then apply: a CheckpointSetting on every planned layer
// (a BudgetRegion per budget layer), use_cache off where the plan says, and
// every message of the plan logged in order.
#pragma once

#include "tools/trainer/config.h"
#include "tools/trainer/discovery.h"
#include "tools/trainer/route_plan.h"
#include "tools/trainer/zoo_common.h"

#include "absl/status/statusor.h"

#include <functional>
#include <optional>
#include <string>
#include <vector>

namespace hpac::trainer {

using LogFn = std::function<void(LogLevel level, const std::string& message)>;
// Writes "[hpac-train] message" / "[hpac-train] warning: message" to stderr.
void logToStderr(LogLevel level, const std::string& message);

struct PreparedLayer {
  LayerRef layer;
  Role role = Role::kLanguage;
  CheckpointMode mode = CheckpointMode::kOff;     // what the plan asked for
  CheckpointSetting setting;  // what was applied (empty when off or not wrappable)
};

struct Preparation {
  bool touched = false;  // false: mode off, the model was left exactly as it was
  Discovery discovery;
  bool kv_sharing = false;
  std::vector<std::string> use_cache_disabled;  // config paths set to use_cache=false
  std::optional<FullRoute> full_route;          // when some layer is full
  std::string full_route_reason;
  int64_t layers_wrapped = 0;      // whole-layer checkpoints
  int64_t submodules_wrapped = 0;  // submodule call sites
  std::vector<PreparedLayer> layers;
  std::vector<std::string> messages;  // everything logged, in order
  std::vector<std::string> warnings;
};

// The budget policy's spec for activation_checkpoint.memory_budget and .cost (each budget layer gets its own
// BudgetRegion).
BudgetSpec budgetSpec(const MemoryBudget& budget, const std::string& cost = "measured");

absl::StatusOr<Preparation> prepareModel(ZooModel& model, const TrainConfig& config, const ModelRegistry& registry,
                                         const LogFn& log = logToStderr);

// Stats of every prepared layer's finished invocations (call after backward),
// in the order of Preparation::layers.
std::vector<LayerStats> takeLayerStats(const Preparation& preparation);

}  // namespace hpac::trainer
