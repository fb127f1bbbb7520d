#include "tools/trainer/route_plan_json.h"

#include "policy/text_format.h"

#include "absl/strings/str_cat.h"

#include <yaml-cpp/yaml.h>

#include <stdexcept>

namespace hpac::trainer {
namespace {

// Thrown while reading, turned into InvalidArgument by routeFactsFromJson.
struct BadFacts : std::runtime_error {
  using std::runtime_error::runtime_error;
};

YAML::Node field(const YAML::Node& node, const std::string& key, const std::string& where) {
  if (!node.IsMap() || !node[key]) throw BadFacts(absl::StrCat(where, key, ": missing"));
  return node[key];
}

template <typename T>
T read(const YAML::Node& node, const std::string& key, const std::string& where) {
  const YAML::Node value = field(node, key, where);
  if (value.IsNull()) throw BadFacts(absl::StrCat(where, key, ": null"));
  try {
    return value.as<T>();
  } catch (const YAML::Exception&) {
    throw BadFacts(absl::StrCat(where, key, ": '", YAML::Dump(value), "' has the wrong type"));
  }
}

std::vector<std::string> names(const YAML::Node& node, const std::string& key, const std::string& where) {
  return read<std::vector<std::string>>(node, key, where);
}

CheckpointMode mode(const YAML::Node& node, const std::string& key, const std::string& where) {
  const std::string name = read<std::string>(node, key, where);
  CheckpointMode m;
  if (!parseCheckpointMode(name, &m)) throw BadFacts(absl::StrCat(where, key, ": '", name, "' is not a mode"));
  return m;
}

Role role(const YAML::Node& node, const std::string& where) {
  const std::string name = read<std::string>(node, "role", where);
  if (name != "language" && name != "vision") {
    throw BadFacts(absl::StrCat(where, "role: '", name, "' is not allowed; allowed: language, vision"));
  }
  return name == "vision" ? Role::kVision : Role::kLanguage;
}

ActivationCheckpointSpec checkpointSpec(const YAML::Node& node) {
  ActivationCheckpointSpec ac;
  ac.mode = mode(node, "mode", "activation_checkpoint.");
  for (const YAML::Node& r : field(node, "layers", "activation_checkpoint.")) {
    LayerRange range;
    range.first = read<int64_t>(r, "first", "activation_checkpoint.layers.");
    range.last = read<int64_t>(r, "last", "activation_checkpoint.layers.");
    range.mode = mode(r, "mode", "activation_checkpoint.layers.");
    range.where = read<std::string>(r, "where", "activation_checkpoint.layers.");
    ac.layers.push_back(range);
  }
  return ac;
}

LayerFacts layerFacts(const YAML::Node& node) {
  const std::string w = "model.layers.";
  LayerFacts l;
  l.path = read<std::string>(node, "path", w);
  l.index = read<int64_t>(node, "index", w);
  l.role = role(node, w);
  l.class_name = read<std::string>(node, "class_name", w);
  l.trainable = read<bool>(node, "trainable", w);
  l.native = read<bool>(node, "native", w);
  l.has_seam = read<bool>(node, "has_seam", w);
  l.children = names(node, "children", w);
  return l;
}

ModelFacts modelFacts(const YAML::Node& node) {
  const std::string w = "model.";
  ModelFacts m;
  m.class_name = read<std::string>(node, "class_name", w);
  m.how = read<std::string>(node, "how", w);
  m.language_path = read<std::string>(node, "language_path", w);
  m.has_vision = read<bool>(node, "has_vision", w);
  m.supports_checkpointing = read<bool>(node, "supports_checkpointing", w);
  for (const YAML::Node& c : field(node, "configs", w)) {
    if (!c.IsSequence() || c.size() != 2) throw BadFacts("model.configs: each entry is [path, num_kv_shared_layers]");
    m.configs.emplace_back(c[0].as<std::string>(), c[1].as<int64_t>());
  }
  for (const YAML::Node& l : field(node, "layers", w)) m.layers.push_back(layerFacts(l));
  return m;
}

ModelRegistry registryOf(const YAML::Node& node) {
  const std::string w = "registry.";
  ModelRegistry r;
  r.file = read<std::string>(node, "file", w);
  r.default_paths = names(node, "default_paths", w);
  for (const auto& item : field(node, "retrieval_wrappers", w)) {
    r.retrieval_wrappers[item.first.as<std::string>()] = item.second.as<std::vector<std::string>>();
  }
  for (const auto& item : field(node, "models", w)) {
    RegistryEntry e;
    e.class_name = item.first.as<std::string>();
    e.family = read<std::string>(item.second, "family", w + "models.");
    e.language = names(item.second, "language", w + "models.");
    e.vision = names(item.second, "vision", w + "models.");
    r.models[e.class_name] = e;
  }
  return r;
}

ModuleFacts moduleFacts(const YAML::Node& row) {
  if (!row.IsSequence() || row.size() != 5) {
    throw BadFacts("modules: each entry is [path, class_name, kind, children, parameters]");
  }
  ModuleFacts m;
  m.path = row[0].as<std::string>();
  m.class_name = row[1].as<std::string>();
  const std::string kind = row[2].as<std::string>();
  if (kind != "list" && kind != "dict" && kind != "other") {
    throw BadFacts(absl::StrCat("modules: kind '", kind, "' is not allowed; allowed: list, dict, other"));
  }
  m.kind = kind == "list" ? ModuleFacts::Kind::kList
                          : kind == "dict" ? ModuleFacts::Kind::kDict : ModuleFacts::Kind::kOther;
  m.children = row[3].as<std::vector<std::string>>();
  m.parameters = row[4].as<int64_t>();
  return m;
}

}  // namespace

absl::StatusOr<std::pair<ModuleTree, ModelRegistry>> moduleTreeFromJson(const std::string& json) {
  try {
    const YAML::Node root = YAML::Load(json);
    ModuleTree tree;
    for (const YAML::Node& row : field(root, "modules", "")) tree.modules.push_back(moduleFacts(row));
    return std::make_pair(std::move(tree), registryOf(field(root, "registry", "")));
  } catch (const BadFacts& e) {
    return absl::InvalidArgumentError(absl::StrCat("module tree: ", e.what()));
  } catch (const YAML::Exception& e) {
    return absl::InvalidArgumentError(absl::StrCat("module tree: not JSON of a module tree: ", e.what()));
  }
}

std::string foundLayersJson(const FoundLayers& found) {
  std::string out = absl::StrCat("{\"class_name\": ", jsonString(found.class_name), ", \"how\": ",
                                 jsonString(found.how), ", \"tried\": ", jsonStringList(found.tried),
                                 ", \"inner_path\": ", jsonString(found.inner_path), ", \"containers\": [");
  for (size_t i = 0; i < found.containers.size(); ++i) {
    const FoundContainer& c = found.containers[i];
    absl::StrAppend(&out, i ? ", " : "", "{\"role\": ", jsonString(toString(c.role)), ", \"path\": ",
                    jsonString(c.path), ", \"layers\": [");
    for (size_t j = 0; j < c.layers.size(); ++j) {
      absl::StrAppend(&out, j ? ", " : "", "[", jsonString(c.layers[j].first), ", ", c.layers[j].second, "]");
    }
    out += "]}";
  }
  return out + "]}";
}

absl::StatusOr<RouteFacts> routeFactsFromJson(const std::string& json) {
  try {
    const YAML::Node root = YAML::Load(json);
    RouteFacts f;
    f.file = read<std::string>(root, "file", "");
    f.activation_checkpoint = checkpointSpec(field(root, "activation_checkpoint", ""));
    const std::string swap = read<std::string>(root, "activation_swap", "");
    if (swap != "none" && swap != "attention") {
      throw BadFacts(absl::StrCat("activation_swap: '", swap, "' is not allowed; allowed: none, attention"));
    }
    f.activation_swap = swap == "attention" ? ActivationSwap::kAttention : ActivationSwap::kNone;
    f.compile = read<bool>(root, "compile", "");
    f.compiles_layers = read<bool>(root, "compiles_layers", "");
    const YAML::Node model = field(root, "model", "");
    if (!model.IsNull()) {
      f.model = modelFacts(model);
      const YAML::Node a = field(root, "aliases", "");
      f.aliases = {names(a, "mlp", "aliases."), names(a, "attention", "aliases."), names(a, "norm1", "aliases."),
                   names(a, "norm2", "aliases."), names(a, "mtp", "aliases.")};
    }
    return f;
  } catch (const BadFacts& e) {
    return absl::InvalidArgumentError(absl::StrCat("route facts: ", e.what()));
  } catch (const YAML::Exception& e) {
    return absl::InvalidArgumentError(absl::StrCat("route facts: not JSON: ", e.what()));
  }
}

std::string routePlanJson(const RoutePlan& plan) {
  std::string out = absl::StrCat(
      "{\"needs_model\": ", plan.needs_model ? "true" : "false", ", \"touched\": ", plan.touched ? "true" : "false",
      ", \"kv_sharing\": ", plan.kv_sharing ? "true" : "false",
      ", \"use_cache_off\": ", jsonStringList(plan.use_cache_off), ", \"full_route\": ",
      plan.full_route ? jsonString(toString(*plan.full_route)) : std::string("null"),
      ", \"full_route_reason\": ", jsonString(plan.full_route_reason), ", \"layers_wrapped\": ", plan.layers_wrapped,
      ", \"submodules_wrapped\": ", plan.submodules_wrapped, ", \"layers\": [");
  for (size_t i = 0; i < plan.layers.size(); ++i) {
    const LayerRoute& l = plan.layers[i];
    absl::StrAppend(&out, i ? ", " : "", "{\"path\": ", jsonString(l.path), ", \"index\": ", l.index,
                    ", \"role\": ", jsonString(toString(l.role)), ", \"mode\": ", jsonString(toString(l.mode)),
                    ", \"layer\": ", jsonString(toString(l.layer)), ", \"native\": ", l.native ? "true" : "false",
                    ", \"submodules\": ", jsonStringList(l.submodules), "}");
  }
  absl::StrAppend(&out, "], \"messages\": [");
  for (size_t i = 0; i < plan.messages.size(); ++i) {
    const auto& [level, text] = plan.messages[i];
    absl::StrAppend(&out, i ? ", " : "", "[", level == LogLevel::kWarning ? "\"warning\"" : "\"info\"", ", ",
                    jsonString(text), "]");
  }
  return out + "]}";
}

}  // namespace hpac::trainer
