#include "tools/trainer/route_plan.h"

#include "policy/text_format.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

#include <algorithm>

namespace hpac::trainer {
namespace {

class Messages {
 public:
  explicit Messages(RoutePlan& plan) : plan_(plan) {}
  void info(std::string m) { plan_.messages.emplace_back(LogLevel::kInfo, std::move(m)); }
  void warn(std::string m) { plan_.messages.emplace_back(LogLevel::kWarning, std::move(m)); }

 private:
  RoutePlan& plan_;
};

bool isPolicyMode(CheckpointMode mode) { return mode == CheckpointMode::kSelective || mode == CheckpointMode::kBudget; }

// The children of `layer` whose names are in any of `lists`, in list order.
std::vector<std::string> childrenNamed(const LayerFacts& layer,
                                       std::initializer_list<const std::vector<std::string>*> lists) {
  std::vector<std::string> out;
  for (const auto* list : lists) {
    for (const std::string& name : *list) {
      if (std::find(layer.children.begin(), layer.children.end(), name) != layer.children.end()) out.push_back(name);
    }
  }
  return out;
}

absl::Status checkSwap(const RouteFacts& f) {
  const ActivationCheckpointSpec& ac = f.activation_checkpoint;
  if (f.activation_swap != ActivationSwap::kAttention || ac.allOff()) return absl::OkStatus();
  const std::string mode = ac.mode != CheckpointMode::kOff
                               ? std::string(toString(ac.mode))
                               : std::string("off with checkpointed layers in activation_checkpoint.layers");
  return absl::FailedPreconditionError(absl::StrCat(
      f.file, ": activation_checkpoint.mode: ", mode,
      " cannot be combined with activation_swap: attention; set activation_swap: none, or "
      "activation_checkpoint.mode: off (and no checkpointed layers)"));
}

// The per-layer plan indexes the language tower.
absl::Status checkPlanEntries(const ActivationCheckpointSpec& ac, const ModelFacts& m) {
  std::vector<int64_t> held;
  for (const LayerFacts& l : m.layers) {
    if (l.role == Role::kLanguage) held.push_back(l.index);
  }
  for (const LayerRange& range : ac.layers) {
    for (int64_t i = range.first; i <= range.last; ++i) {
      if (std::find(held.begin(), held.end(), i) != held.end()) continue;
      return absl::InvalidArgumentError(absl::StrCat(range.where, ": activation_checkpoint.layers: layer ", i,
                                                     " is out of range; the language tower ", m.language_path,
                                                     " holds layers ", absl::StrJoin(held, ", ")));
    }
  }
  return absl::OkStatus();
}

// Budget plans from eager profiles of the layer, which compiled code never runs.
absl::Status checkCompiledBudget(const RouteFacts& f, const std::vector<LayerRoute>& layers) {
  if (!f.compile || !f.compiles_layers) return absl::OkStatus();
  std::vector<int64_t> budgeted;
  for (const LayerRoute& p : layers) {
    if (p.mode == CheckpointMode::kBudget) budgeted.push_back(p.index);
  }
  if (budgeted.empty()) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(
      f.file, ": activation_checkpoint mode budget (layers ", absl::StrJoin(budgeted, ", "),
      ") cannot be combined with train.compile: true: hpac's budget plans from eager profiles of the layer, which "
      "compiled code never runs; use mode selective or full with compile, or train.compile: false"));
}

void planKvSharing(const ModelFacts& m, RoutePlan& plan, Messages& log) {
  for (const auto& [path, shared] : m.configs) plan.kv_sharing = plan.kv_sharing || shared > 0;
  if (plan.kv_sharing) {
    for (const auto& [path, shared] : m.configs) {
      if (shared > 0) {
        log.info(absl::StrCat("KV sharing (", path, ".num_kv_shared_layers = ", shared,
                              "): use_cache kept, attention is never checkpointed"));
      }
    }
    return;
  }
  for (const auto& [path, shared] : m.configs) plan.use_cache_off.push_back(path);
  log.info(absl::StrCat("use_cache set false on ",
                        plan.use_cache_off.empty() ? std::string("(no config)") : joinNames(plan.use_cache_off)));
}

// Note [Full decision order]: the reference design's flowchart, checked top to bottom; the first that holds decides
// (docs/trainer.md).
void planFullRoute(const RouteFacts& f, const ModelFacts& m, RoutePlan& plan, Messages& log) {
  bool any_full = false, all_native = true, all_trainable = true;
  for (size_t i = 0; i < plan.layers.size(); ++i) {
    if (plan.layers[i].mode != CheckpointMode::kFull) continue;
    any_full = true;
    all_native = all_native && m.layers[i].has_seam && m.layers[i].native;
    all_trainable = all_trainable && m.layers[i].trainable;
  }
  if (!any_full) return;
  std::vector<std::string> not_native;
  if (!all_trainable) not_native.push_back("some layers are frozen");
  if (!all_native) not_native.push_back("some layers have no native checkpoint path");
  if (!m.supports_checkpointing) not_native.push_back("the model does not declare checkpointing support");
  if (m.has_vision) {
    plan.full_route = FullRoute::kSubmodules;
    plan.full_route_reason = "not language-tower-only: the model has a vision tower";
  } else if (plan.kv_sharing) {
    plan.full_route = FullRoute::kSubmodules;
    plan.full_route_reason = "KV sharing: attention must not be checkpointed";
  } else if (f.compile) {
    plan.full_route = FullRoute::kCompile;
    plan.full_route_reason = "compile is on: attention and MLP submodules only";
  } else if (not_native.empty()) {
    plan.full_route = FullRoute::kNative;
    plan.full_route_reason = "language tower only, no compile, every layer trainable and native, model supports it";
  } else {
    plan.full_route = FullRoute::kSubmodules;
    plan.full_route_reason = "not native: " + joinNames(not_native);
  }
  log.info(absl::StrCat("full: ", toString(*plan.full_route), " path (", plan.full_route_reason, ")"));
}

// What one non-off layer gets: a whole-layer checkpoint, the native path, or full checkpoints of some children.
void planLayer(const LayerFacts& facts, const AliasLists& a, const RoutePlan& plan, LayerRoute& p,
               bool& warned_degrade, Messages& log) {
  if (isPolicyMode(p.mode) && !plan.kv_sharing) {
    p.layer = p.mode;  // one region per layer: each profiles and plans its own forward (MoE routing differs)
  } else if (isPolicyMode(p.mode)) {
    if (!warned_degrade) {
      log.warn(absl::StrCat(toString(p.mode), " with KV sharing degrades to submodule checkpointing (full) of "
                            "the MLP and norms; attention is not checkpointed"));
      warned_degrade = true;
    }
    p.submodules = childrenNamed(facts, {&a.mlp, &a.norm1, &a.norm2, &a.mtp});
  } else if (*plan.full_route == FullRoute::kNative) {
    p.layer = CheckpointMode::kFull;
    p.native = true;
  } else if (*plan.full_route == FullRoute::kCompile) {
    p.submodules = childrenNamed(facts, {&a.attention, &a.mlp});
  } else if (plan.kv_sharing) {
    p.submodules = childrenNamed(facts, {&a.mlp, &a.norm1, &a.norm2, &a.mtp});
  } else {
    p.submodules = childrenNamed(facts, {&a.mlp, &a.attention, &a.norm1, &a.norm2, &a.mtp});
  }
}

// Whether the plan needs ModelFacts: some layer can be checkpointed, or the front end compiles the layers.
bool needsDiscovery(const RouteFacts& facts) {
  return !facts.activation_checkpoint.allOff() || (facts.compile && facts.compiles_layers);
}

}  // namespace

const char* toString(FullRoute route) {
  switch (route) {
    case FullRoute::kNative: return "native";
    case FullRoute::kCompile: return "compile";
    case FullRoute::kSubmodules: return "submodules";
  }
  return "?";
}

absl::StatusOr<RoutePlan> planRoutes(const RouteFacts& f) {
  RoutePlan plan;
  Messages log(plan);
  const ActivationCheckpointSpec& ac = f.activation_checkpoint;
  if (absl::Status s = checkSwap(f); !s.ok()) return s;
  if (!f.model && needsDiscovery(f)) {
    plan.needs_model = true;
    return plan;
  }
  if (ac.allOff()) {
    if (f.compile && f.compiles_layers) return plan;  // the front end compiles the layers as they are
    log.info("activation checkpointing off: model left as is (no discovery, no wrapping, use_cache untouched)");
    if (f.activation_swap == ActivationSwap::kAttention) {
      log.warn("activation_swap: attention has nothing to swap to on a CPU-only build; it has no effect");
    }
    return plan;
  }
  const ModelFacts& m = *f.model;
  plan.touched = true;
  log.info(absl::StrCat("layer containers of ", m.class_name, ": ", m.how));
  if (absl::Status s = checkPlanEntries(ac, m); !s.ok()) return s;
  planKvSharing(m, plan, log);
  for (const LayerFacts& l : m.layers) {
    LayerRoute p;
    p.path = l.path;
    p.index = l.index;
    p.role = l.role;
    p.mode = l.role == Role::kLanguage ? ac.modeOf(l.index) : ac.mode;
    plan.layers.push_back(std::move(p));
  }
  if (absl::Status s = checkCompiledBudget(f, plan.layers); !s.ok()) return s;
  planFullRoute(f, m, plan, log);

  bool warned_degrade = false;
  int64_t planned = 0;
  for (size_t i = 0; i < plan.layers.size(); ++i) {
    LayerRoute& p = plan.layers[i];
    if (p.mode == CheckpointMode::kOff) continue;
    ++planned;
    if (!m.layers[i].has_seam) {
      log.warn(absl::StrCat("layer ", p.path, " (", m.layers[i].class_name,
                            ") has no checkpoint seam (not a CheckpointableLayer); left unwrapped"));
      continue;
    }
    planLayer(m.layers[i], f.aliases, plan, p, warned_degrade, log);
    plan.layers_wrapped += p.layer != CheckpointMode::kOff;
    plan.submodules_wrapped += static_cast<int64_t>(p.submodules.size());
  }
  log.info(absl::StrCat("wrapped ", plan.layers_wrapped, " layers whole and ", plan.submodules_wrapped,
                        " submodules (", planned, " of ", plan.layers.size(), " layers planned non-off)"));
  if (plan.layers_wrapped + plan.submodules_wrapped == 0) {
    log.warn(absl::StrCat("0 modules wrapped: no layer of ", m.class_name,
                          " could be checkpointed (submodule names outside the alias lists, or no seam); "
                          "training runs without activation checkpointing"));
  }
  return plan;
}

}  // namespace hpac::trainer
