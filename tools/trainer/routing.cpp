#include "tools/trainer/routing.h"

#include "tools/trainer/yaml_reader.h"  // joinNames

#include "replay/op_cost.h"

#include "absl/strings/str_cat.h"

#include <iostream>

namespace hpac::trainer {
namespace {

class Logger {
 public:
  Logger(Preparation& p, const LogFn& fn) : p_(p), fn_(fn) {}
  void info(const std::string& m) {
    p_.messages.push_back(m);
    if (fn_) fn_(LogLevel::kInfo, m);
  }
  void warn(const std::string& m) {
    p_.messages.push_back("warning: " + m);
    p_.warnings.push_back(m);
    if (fn_) fn_(LogLevel::kWarning, m);
  }

 private:
  Preparation& p_;
  const LogFn& fn_;
};

bool trainable(const torch::nn::Module& layer) {
  for (const at::Tensor& p : layer.parameters()) {
    if (!p.requires_grad()) return false;
  }
  return true;
}

// The children of `layer` whose names are in any of `lists`, in list order.
std::vector<std::string> childrenNamed(const torch::nn::Module& layer,
                                       const std::vector<const std::vector<std::string>*>& lists) {
  const auto children = layer.named_children();
  std::vector<std::string> out;
  for (const auto* list : lists) {
    for (const std::string& name : *list) {
      if (children.contains(name)) out.push_back(name);
    }
  }
  return out;
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

void logToStderr(LogLevel level, const std::string& message) {
  std::cerr << "[hpac-train] " << (level == LogLevel::kWarning ? "warning: " : "") << message << "\n";
}

BudgetSpec budgetSpec(const MemoryBudget& budget, const std::string& cost) {
  BudgetSpec spec = makeBudgetSpec(budget.fraction >= 0 ? std::optional<double>(budget.fraction) : std::nullopt,
                                   budget.bytes >= 0 ? std::optional<int64_t>(budget.bytes) : std::nullopt);
  spec.cost = parseBudgetCost(cost);  // the parser allowed only measured | estimated
  (void)deviceRoofline(c10::Device(c10::kCPU));  // Note [The roofline is measured outside regions]
  return spec;
}

absl::StatusOr<Preparation> prepareModel(ZooModel& model, const TrainConfig& config, const ModelRegistry& registry,
                                         const LogFn& log) {
  Preparation prep;
  Logger logger(prep, log);
  const ActivationCheckpointSpec& ac = config.activation_checkpoint;

  if (config.activation_swap == ActivationSwap::kAttention && !ac.allOff()) {
    const std::string mode = ac.mode != CheckpointMode::kOff
                                 ? std::string(toString(ac.mode))
                                 : std::string("off with checkpointed layers in activation_checkpoint.layers");
    return absl::FailedPreconditionError(absl::StrCat(
        config.file, ": activation_checkpoint.mode: ", mode,
        " cannot be combined with activation_swap: attention; set activation_swap: none, or "
        "activation_checkpoint.mode: off (and no checkpointed layers)"));
  }
  if (config.train.compile) {
    // Note [hpac under torch.compile] (docs/design.md): hpac.hf compiles each layer after wrapping.
    logger.info("train.compile: true chooses the routes only here: libtorch has no compiler, every layer runs "
                "eagerly; python -m hpac.hf_demo compiles each layer after wrapping");
  }
  if (ac.allOff()) {
    logger.info("activation checkpointing off: model left as is (no discovery, no wrapping, use_cache untouched)");
    if (config.activation_swap == ActivationSwap::kAttention) {
      logger.warn("activation_swap: attention has nothing to swap to on a CPU-only build; it has no effect");
    }
    return prep;
  }

  auto discovery = discoverLayers(model, registry);
  if (!discovery.ok()) return discovery.status();
  prep.discovery = *std::move(discovery);
  prep.touched = true;
  const Discovery& d = prep.discovery;
  logger.info(absl::StrCat("layer containers of ", d.class_name, ": ", d.how));
  const LayerContainer* language = d.language();

  // The per-layer plan indexes the language tower.
  for (const LayerRange& range : ac.layers) {
    for (int64_t i = range.first; i <= range.last; ++i) {
      bool found = false;
      for (const LayerRef& l : language->layers) found = found || l.index == i;
      if (!found) {
        std::string held;
        for (const LayerRef& l : language->layers) absl::StrAppend(&held, held.empty() ? "" : ", ", l.index);
        return absl::InvalidArgumentError(
            absl::StrCat(range.where, ": activation_checkpoint.layers: layer ", i, " is out of range; the language "
                         "tower ", language->path, " holds layers ", held));
      }
    }
  }

  prep.kv_sharing = model.config().sharesKv();
  if (prep.kv_sharing) {
    model.config().forEach([&](const std::string& path, ModelConfig& c) {
      if (c.num_kv_shared_layers > 0) {
        logger.info(absl::StrCat("KV sharing (", path, ".num_kv_shared_layers = ", c.num_kv_shared_layers,
                                 "): use_cache kept, attention is never checkpointed"));
      }
    });
  } else {
    model.config().forEach([&](const std::string& path, ModelConfig& c) {
      c.use_cache = false;
      prep.use_cache_disabled.push_back(path);
    });
    logger.info(absl::StrCat("use_cache set false on ", joinNames(prep.use_cache_disabled)));
  }

  // Plan: the mode of every discovered layer.
  for (const LayerContainer& c : d.containers) {
    for (const LayerRef& l : c.layers) {
      PreparedLayer p;
      p.layer = l;
      p.role = c.role;
      p.mode = c.role == Role::kLanguage ? ac.modeOf(l.index) : ac.mode;
      prep.layers.push_back(std::move(p));
    }
  }

  // Full: one route for the model (6.2).
  bool any_full = false, all_native = true, all_trainable = true;
  for (const PreparedLayer& p : prep.layers) {
    if (p.mode != CheckpointMode::kFull) continue;
    any_full = true;
    all_native = all_native && p.layer.checkpointable != nullptr && p.layer.checkpointable->supportsNativeCheckpoint();
    all_trainable = all_trainable && trainable(*p.layer.module);
  }
  if (any_full) {
    // Note [Full decision order]: the reference design's flowchart, checked top to bottom; the first that holds
    // decides (docs/trainer.md; plugin/python/hpac/hf.py follows the same order).
    std::vector<std::string> not_native;
    if (!all_trainable) not_native.push_back("some layers are frozen");
    if (!all_native) not_native.push_back("some layers are not native checkpointable layers");
    if (!model.supportsGradientCheckpointing()) not_native.push_back("the model does not declare checkpointing support");
    if (d.vision() != nullptr) {
      prep.full_route = FullRoute::kSubmodules;
      prep.full_route_reason = "not language-tower-only: the model has a vision tower";
    } else if (prep.kv_sharing) {
      prep.full_route = FullRoute::kSubmodules;
      prep.full_route_reason = "KV sharing: attention must not be checkpointed";
    } else if (config.train.compile) {
      prep.full_route = FullRoute::kCompile;
      prep.full_route_reason = "compile is on: attention and MLP submodules only";
    } else if (not_native.empty()) {
      prep.full_route = FullRoute::kNative;
      prep.full_route_reason = "language tower only, no compile, every layer trainable and native, model supports it";
    } else {
      prep.full_route = FullRoute::kSubmodules;
      prep.full_route_reason = "not native: " + joinNames(not_native);
    }
    logger.info(absl::StrCat("full: ", toString(*prep.full_route), " path (", prep.full_route_reason, ")"));
  }

  const AliasLists& a = registry.aliases;
  bool warned_degrade = false;
  for (PreparedLayer& p : prep.layers) {
    if (p.mode == CheckpointMode::kOff) continue;
    if (p.layer.checkpointable == nullptr) {
      logger.warn(absl::StrCat("layer ", p.layer.path, " (", p.layer.module->name(),
                               ") has no checkpoint seam (not a CheckpointableLayer); left unwrapped"));
      continue;
    }
    CheckpointSetting s;
    s.routing = ac.routing;
    s.state_writes = ac.state_writes;
    std::vector<std::string> subs;
    const bool policy_mode = p.mode == CheckpointMode::kSelective || p.mode == CheckpointMode::kBudget;
    if (policy_mode && !prep.kv_sharing) {
      s.layer = p.mode;
      // One region per layer: each layer profiles and plans its own forward (MoE routing differs per layer).
      if (p.mode == CheckpointMode::kBudget) s.budget = std::make_shared<BudgetRegion>(budgetSpec(*ac.memory_budget, ac.cost));
    } else if (policy_mode) {
      if (!warned_degrade) {
        logger.warn(absl::StrCat(toString(p.mode), " with KV sharing degrades to submodule checkpointing (full) of "
                                 "the MLP and norms; attention is not checkpointed"));
        warned_degrade = true;
      }
      subs = childrenNamed(*p.layer.module, {&a.mlp, &a.norm1, &a.norm2, &a.mtp});
    } else if (*prep.full_route == FullRoute::kNative) {
      s.layer = CheckpointMode::kFull;
      s.reentrant = true;
    } else if (*prep.full_route == FullRoute::kCompile) {
      subs = childrenNamed(*p.layer.module, {&a.attention, &a.mlp});
    } else if (prep.kv_sharing) {
      subs = childrenNamed(*p.layer.module, {&a.mlp, &a.norm1, &a.norm2, &a.mtp});
    } else {
      subs = childrenNamed(*p.layer.module, {&a.mlp, &a.attention, &a.norm1, &a.norm2, &a.mtp});
    }
    for (const std::string& name : subs) s.submodules[name] = CheckpointMode::kFull;
    if (!s.enabled()) continue;
    p.layer.checkpointable->setCheckpoint(s);
    p.setting = s;
    if (s.layer != CheckpointMode::kOff) ++prep.layers_wrapped;
    prep.submodules_wrapped += static_cast<int64_t>(s.submodules.size());
  }

  int64_t checkpointed = 0;
  for (const PreparedLayer& p : prep.layers) checkpointed += p.mode != CheckpointMode::kOff;
  logger.info(absl::StrCat("wrapped ", prep.layers_wrapped, " layers whole and ", prep.submodules_wrapped,
                           " submodules (", checkpointed, " of ", prep.layers.size(), " layers planned non-off)"));
  if (prep.layers_wrapped + prep.submodules_wrapped == 0) {
    logger.warn(absl::StrCat("0 modules wrapped: no layer of ", d.class_name,
                             " could be checkpointed (submodule names outside the alias lists, or no seam); "
                             "training runs without activation checkpointing"));
  }
  return prep;
}

std::vector<LayerStats> takeLayerStats(const Preparation& preparation) {
  std::vector<LayerStats> out;
  for (const PreparedLayer& p : preparation.layers) {
    out.push_back(p.layer.checkpointable != nullptr ? p.layer.checkpointable->takeStats() : LayerStats{});
  }
  return out;
}

}  // namespace hpac::trainer
