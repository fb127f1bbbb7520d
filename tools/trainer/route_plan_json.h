// hpac/tools/trainer/route_plan_json.h
//
// The pure rules' facts and results as JSON: how hpac.hf (Python) reaches
// findLayers (layer_finder.h) through torch.ops.hpac_config.find_layers and
// planRoutes (route_plan.h) through torch.ops.hpac_config.plan_routes, and how
// the planner's table of cases (test/trainer/route_cases.json) feeds both front
// ends' tests.
//
// Module tree: {"registry": <torch.ops.hpac_config.load_registry's JSON>,
// "modules": [[path, class_name, "list" | "dict" | "other", [child names],
// parameters], ...]} (root first, path ""). Found layers: {"class_name", "how",
// "tried", "inner_path", "containers": [{"role", "path", "layers": [[path,
// index], ...]}]}.
//
// Facts: {"file", "activation_checkpoint": {"mode", "layers": [{"first", "last",
// "mode", "where"}], ...} (as torch.ops.hpac_config.load_config gives it; other
// keys are ignored), "activation_swap", "compile", "compiles_layers",
// "aliases" (with a model only): {"mlp": [...], "attention", "norm1", "norm2", "mtp"}, "model": null
// or {"class_name", "how", "language_path", "has_vision",
// "supports_checkpointing", "configs": [["config", 0], ...], "layers":
// [{"path", "index", "role", "class_name", "trainable", "native", "has_seam",
// "children": [...]}]}}. Keys are the C++ field names of route_plan.h; a key
// missing from "model" or a layer is an error naming it.
//
// Plan: {"needs_model", "touched", "kv_sharing", "use_cache_off", "full_route" (null or a
// FullRoute name), "full_route_reason", "layers_wrapped", "submodules_wrapped",
// "layers": [{"path", "index", "role", "mode", "layer", "native",
// "submodules"}], "messages": [["info" | "warning", text], ...]}.
#pragma once

#include "tools/trainer/layer_finder.h"
#include "tools/trainer/route_plan.h"

#include "absl/status/statusor.h"

#include <string>
#include <utility>
#include <vector>

namespace hpac::trainer {

// InvalidArgument "route facts: <key>: <what>" for JSON that does not hold the facts above.
absl::StatusOr<RouteFacts> routeFactsFromJson(const std::string& json);
std::string routePlanJson(const RoutePlan& plan);
// InvalidArgument "module tree: <key>: <what>" for JSON that does not hold a module tree and a registry.
absl::StatusOr<std::pair<ModuleTree, ModelRegistry>> moduleTreeFromJson(const std::string& json);
std::string foundLayersJson(const FoundLayers& found);

}  // namespace hpac::trainer
