#include "tools/trainer/routing.h"


#include "policy/policy_kind.h"
#include "replay/op_cost.h"

#include "absl/strings/str_cat.h"

#include <algorithm>
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

RouteFacts configFacts(const TrainConfig& config, const ModelRegistry& registry) {
  RouteFacts f;
  f.file = config.file;
  f.activation_checkpoint = config.activation_checkpoint;
  f.activation_swap = config.activation_swap;
  f.compile = config.train.compile;
  f.compiles_layers = false;  // libtorch has no compiler
  f.aliases = registry.aliases;
  return f;
}

ModelFacts modelFacts(ZooModel& model, const Discovery& d) {
  ModelFacts m;
  m.class_name = d.class_name;
  m.how = d.how;
  m.language_path = d.language()->path;
  m.has_vision = d.vision() != nullptr;
  m.supports_checkpointing = model.supportsGradientCheckpointing();
  model.config().forEach([&](const std::string& path, ModelConfig& c) {
    m.configs.emplace_back(path, c.num_kv_shared_layers);
  });
  for (const LayerContainer& c : d.containers) {
    for (const LayerRef& l : c.layers) {
      LayerFacts lf;
      lf.path = l.path;
      lf.index = l.index;
      lf.role = c.role;
      lf.class_name = l.module->name();
      lf.trainable = trainable(*l.module);
      lf.has_seam = l.checkpointable != nullptr;
      lf.native = lf.has_seam && l.checkpointable->supportsNativeCheckpoint();
      for (const auto& child : l.module->named_children()) lf.children.push_back(child.key());
      m.layers.push_back(std::move(lf));
    }
  }
  return m;
}

// The plan's CheckpointSetting of one layer.
CheckpointSetting settingOf(const LayerRoute& plan, const ActivationCheckpointSpec& ac) {
  CheckpointSetting s;
  s.routing = ac.routing;
  s.state_writes = ac.state_writes;
  if (ac.policy != "selective") {
    s.selective_policy = policyForKind(parsePolicyKind(ac.policy, "hpac"), ac.policy_params, "hpac");
  }
  s.layer = plan.layer;
  s.reentrant = plan.native;
  // One region per layer: each layer profiles and plans its own forward (MoE routing differs per layer).
  if (plan.layer == CheckpointMode::kBudget) {
    // memory_target: each region starts at budget 0 (its profile recomputes everything); the target replans it.
    MemoryBudget zero;  // no fraction, 0 bytes
    zero.bytes = 0;
    s.budget = std::make_shared<BudgetRegion>(budgetSpec(ac.memory_budget ? *ac.memory_budget : zero, ac.cost));
  }
  for (const std::string& name : plan.submodules) s.submodules[name] = CheckpointMode::kFull;
  return s;
}

void apply(const RoutePlan& plan, ZooModel& model, const ActivationCheckpointSpec& ac, Preparation& prep) {
  prep.touched = plan.touched;
  prep.kv_sharing = plan.kv_sharing;
  prep.full_route = plan.full_route;
  prep.full_route_reason = plan.full_route_reason;
  prep.layers_wrapped = plan.layers_wrapped;
  prep.submodules_wrapped = plan.submodules_wrapped;
  model.config().forEach([&](const std::string& path, ModelConfig& c) {
    if (std::find(plan.use_cache_off.begin(), plan.use_cache_off.end(), path) == plan.use_cache_off.end()) return;
    c.use_cache = false;
    prep.use_cache_disabled.push_back(path);
  });
  size_t i = 0;
  for (const LayerContainer& c : prep.discovery.containers) {
    for (const LayerRef& l : c.layers) {
      const LayerRoute& lp = plan.layers.at(i++);
      PreparedLayer p;
      p.layer = l;
      p.role = c.role;
      p.mode = lp.mode;
      if (lp.wrapped() && l.checkpointable != nullptr) {
        p.setting = settingOf(lp, ac);
        l.checkpointable->setCheckpoint(p.setting);
      }
      prep.layers.push_back(std::move(p));
    }
  }
}

}  // namespace

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
  RouteFacts facts = configFacts(config, registry);
  auto plan = planRoutes(facts);  // the config's own conflicts are refused before discovery
  if (!plan.ok()) return plan.status();
  if (config.train.compile) {
    // Note [hpac under torch.compile] (docs/design.md): hpac.hf compiles each layer after wrapping.
    logger.info("train.compile: true chooses the routes only here: libtorch has no compiler, every layer runs "
                "eagerly; python -m hpac.harness.demo compiles each layer after wrapping");
  }
  if (plan->needs_model) {
    auto discovery = discoverLayers(model, registry);
    if (!discovery.ok()) return discovery.status();
    prep.discovery = *std::move(discovery);
    facts.model = modelFacts(model, prep.discovery);
    plan = planRoutes(facts);
    if (!plan.ok()) return plan.status();
  }
  for (const auto& [level, message] : plan->messages) {
    level == LogLevel::kWarning ? logger.warn(message) : logger.info(message);
  }
  apply(*plan, model, config.activation_checkpoint, prep);
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
