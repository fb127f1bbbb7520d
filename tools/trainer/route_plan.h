// hpac/tools/trainer/route_plan.h
//
// The route planner: every decision of model preparation (the reference
// design's 6.2-6.4: docs/design.md) as one pure function, facts in, plan out. Both front ends call it:
// the C++ trainer (routing.cpp, over its zoo models) and hpac.hf (Python, over
// transformers models, through torch.ops.hpac_config.plan_routes). A front end
// only gathers facts (discovery, which layers are trainable or have a native
// path, the config's KV sharing) and applies the plan (wraps, sets use_cache,
// logs the messages in order); what to do is decided here, once.
//
//   off        nothing is touched: no discovery, no wrapping, no config change.
//   selective  every discovered layer is checkpointed whole with the built-in
//              selective policy (one invocation per layer call).
//   budget     as selective, with the memory-budget policy (one region per layer).
//   full       one route for the model, the first that holds in this order
//              (the reference design's flowchart, Note [Full decision order]):
//              1. a vision tower (not language-tower-only) -> submodules;
//              2. KV sharing                               -> submodules without attention;
//              3. compile on -> compile: the attention and MLP submodules only;
//              4. every full layer trainable and native, and the model declares
//                 checkpointing support -> native: the layer's own checkpoint
//                 path, whole layer;
//              5. otherwise -> submodules: per layer, the children named in the
//                 alias lists (mlp, attention, norm1, norm2, mtp).
//   KV sharing (num_kv_shared_layers > 0 in the config or a sub-config): use_cache
//              is kept, attention is never checkpointed, full takes the submodule
//              route without attention, and selective (or budget) degrades (with a
//              warning) to full checkpointing of the MLP, norm and MTP submodules.
//              Without KV sharing, use_cache is set false on the config and every
//              sub-config.
//   activation_swap: attention together with any non-off mode is an error; so is
//              budget where the front end compiles its layers (budget plans from
//              eager profiles, which compiled code never runs).
//
// Every decision is a message of the plan (route taken, modules wrapped); 0
// wrapped is a warning.
#pragma once

#include "tools/trainer/config.h"
#include "tools/trainer/registry.h"

#include "absl/status/statusor.h"

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace hpac::trainer {

enum class FullRoute { kNative, kCompile, kSubmodules };
const char* toString(FullRoute route);

enum class LogLevel { kInfo, kWarning };

// What a front end knows of one discovered layer.
struct LayerFacts {
  std::string path;        // dotted path from the root, e.g. model.layers.3
  int64_t index = 0;       // position in its container (or numeric ModuleDict key)
  Role role = Role::kLanguage;
  std::string class_name;  // for messages
  bool trainable = true;   // every parameter requires grad
  bool native = false;     // the layer has the model's own checkpoint path (C++: a CheckpointableLayer that
                           // supports it; Python: a transformers GradientCheckpointingLayer)
  bool has_seam = true;    // the front end can checkpoint it at all (C++: a CheckpointableLayer)
  std::vector<std::string> children;  // names of its child modules, in order
};

// What a front end knows of the model, after discovery.
struct ModelFacts {
  std::string class_name;
  std::string how;               // how discovery found the containers
  std::string language_path;     // the language tower's container path
  bool has_vision = false;
  bool supports_checkpointing = false;  // the model declares its own (native) checkpointing
  // The config and its sub-configs: (path, num_kv_shared_layers), e.g. ("config.text_config", 0).
  std::vector<std::pair<std::string, int64_t>> configs;
  std::vector<LayerFacts> layers;  // language tower first, then vision
};

struct RouteFacts {
  std::string file = "<defaults>";  // the config file, for messages
  ActivationCheckpointSpec activation_checkpoint;
  ActivationSwap activation_swap = ActivationSwap::kNone;
  bool compile = false;          // train.compile
  bool compiles_layers = false;  // the front end compiles each layer after wrapping (hpac.hf)
  AliasLists aliases;
  // Unset until the front end has discovered; planRoutes says when it needs them (RoutePlan::needs_model).
  std::optional<ModelFacts> model;
};

struct LayerRoute {
  std::string path;
  int64_t index = 0;
  Role role = Role::kLanguage;
  CheckpointMode mode = CheckpointMode::kOff;   // what the config asks for this layer
  CheckpointMode layer = CheckpointMode::kOff;  // the whole-layer checkpoint applied: off, full, selective, budget
  bool native = false;                          // layer == full through the layer's own checkpoint path
  std::vector<std::string> submodules;          // children checkpointed full, by name
  bool wrapped() const { return layer != CheckpointMode::kOff || !submodules.empty(); }
};

struct RoutePlan {
  // The facts have no ModelFacts but the plan needs them: discover, then plan again with them.
  bool needs_model = false;
  bool touched = false;  // false: every mode off, the model is left exactly as it is
  bool kv_sharing = false;
  std::vector<std::string> use_cache_off;  // config paths to set use_cache = false on
  std::optional<FullRoute> full_route;     // when some layer is full
  std::string full_route_reason;
  std::vector<LayerRoute> layers;  // one per discovered layer, in ModelFacts order (empty when untouched)
  int64_t layers_wrapped = 0;      // whole-layer checkpoints
  int64_t submodules_wrapped = 0;  // submodule call sites
  std::vector<std::pair<LogLevel, std::string>> messages;  // to log, in order
};

// The plan for `facts`. Errors (InvalidArgument / FailedPrecondition, naming the config file or key): a checkpoint
// mode with activation_swap: attention, a layer plan entry outside the language tower, budget with compiled layers.
absl::StatusOr<RoutePlan> planRoutes(const RouteFacts& facts);

}  // namespace hpac::trainer
