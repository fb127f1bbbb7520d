// hpac/tools/trainer/routing.h
//
// Model preparation: from the config's activation_checkpoint section to a
// CheckpointSetting on every discovered layer (reference design 6.2-6.4).
//
//   off        nothing is touched: no discovery, no wrapping, no config change.
//   selective  every discovered layer is checkpointed whole with the built-in
//              selective policy (one invocation per layer call).
//   budget     as selective, with the memory-budget policy: each layer has its
//              own BudgetRegion (memory_budget), kept across steps, which
//              profiles the layer's first forward and replays its plan after.
//   full       one route for the model, the first that holds in this order
//              (the reference design's flowchart, Note [Full decision order]):
//              1. a vision tower (not language-tower-only) -> submodules;
//              2. KV sharing                               -> submodules without attention;
//              3. compile on -> compile: the attention and MLP submodules only;
//              4. every full layer trainable and a CheckpointableLayer with
//                 native support, and the model declares
//                 supportsGradientCheckpointing() -> native: the layer's own
//                 reentrant path, whole layer;
//              5. otherwise -> submodules: per layer, the children named in the
//                 alias lists (mlp, attention, norm1, norm2, mtp).
//   KV sharing (num_kv_shared_layers > 0 in the config or a sub-config): use_cache
//              is kept, attention is never checkpointed, full takes the submodule
//              route without attention, and selective (or budget) degrades (with a warning)
//              to full checkpointing of the MLP and norm submodules. Without KV
//              sharing, use_cache is set false on the config and every sub-config.
//   activation_swap: attention together with any non-off mode is an error.
//
// Every decision is logged (path taken, modules wrapped); 0 wrapped is a warning.
#pragma once

#include "tools/trainer/config.h"
#include "tools/trainer/discovery.h"
#include "tools/trainer/zoo_common.h"

#include "absl/status/statusor.h"

#include <functional>
#include <optional>
#include <string>
#include <vector>

namespace hpac::trainer {

enum class FullRoute { kNative, kCompile, kSubmodules };
const char* toString(FullRoute route);

enum class LogLevel { kInfo, kWarning };
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
