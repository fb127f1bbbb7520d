#include "tools/trainer/layer_finder.h"

#include "policy/text_format.h"

#include "absl/strings/str_cat.h"

#include <map>

namespace hpac::trainer {
namespace {

bool numericKey(const std::string& key) {
  return !key.empty() && key.size() <= 9 && key.find_first_not_of("0123456789") == std::string::npos;
}

// The tree below `base` (a module path), addressed by paths relative to it.
class Subtree {
 public:
  Subtree(const ModuleTree& tree, const std::map<std::string, const ModuleFacts*>& index, std::string base)
      : tree_(tree), index_(index), base_(std::move(base)) {}

  const ModuleFacts* find(const std::string& relative) const {
    auto it = index_.find(full(relative));
    return it == index_.end() ? nullptr : it->second;
  }
  const ModuleFacts& root() const { return *find(""); }
  Subtree below(const std::string& relative) const { return Subtree(tree_, index_, full(relative)); }
  // Calls fn(relative path, module) for every module strictly below the base, in tree order.
  template <typename Fn>
  void forEachBelow(Fn fn) const {
    const std::string prefix = base_.empty() ? "" : base_ + ".";
    for (const ModuleFacts& m : tree_.modules) {
      if (m.path.size() > prefix.size() && m.path.compare(0, prefix.size(), prefix) == 0) {
        fn(m.path.substr(prefix.size()), m);
      }
    }
  }

 private:
  std::string full(const std::string& relative) const {
    if (relative.empty()) return base_;
    return base_.empty() ? relative : base_ + "." + relative;
  }
  const ModuleTree& tree_;
  const std::map<std::string, const ModuleFacts*>& index_;
  std::string base_;
};

FoundContainer makeContainer(const ModuleFacts& module, Role role, const std::string& path) {
  FoundContainer c;
  c.role = role;
  c.path = path;
  int64_t position = 0;
  for (const std::string& key : module.children) {
    c.layers.emplace_back(path + "." + key, module.kind == ModuleFacts::Kind::kList ? position : std::stoll(key));
    ++position;
  }
  return c;
}

// The first path in `paths` that is a layer container, recording every path tried.
const ModuleFacts* firstContainer(const Subtree& tree, const std::vector<std::string>& paths,
                                  std::vector<std::string>& tried, std::string& found) {
  for (const std::string& p : paths) {
    tried.push_back(p);
    const ModuleFacts* m = tree.find(p);
    if (m != nullptr && isLayerContainer(*m)) {
      found = p;
      return m;
    }
  }
  return nullptr;
}

absl::StatusOr<FoundLayers> findIn(const Subtree& tree, const ModelRegistry& registry);

absl::StatusOr<FoundLayers> throughWrapper(const Subtree& tree, const ModelRegistry& registry, FoundLayers d,
                                           const std::vector<std::string>& inner_paths) {
  for (const std::string& p : inner_paths) {
    d.tried.push_back(p);
    if (tree.find(p) == nullptr) continue;
    auto sub = findIn(tree.below(p), registry);
    if (!sub.ok()) {
      return absl::NotFoundError(absl::StrCat("retrieval wrapper ", d.class_name, " -> ", p, ": ",
                                              sub.status().message()));
    }
    d.how = absl::StrCat("retrieval wrapper ", d.class_name, " -> inner model '", p, "' (", sub->class_name,
                         "): ", sub->how);
    for (std::string& t : sub->tried) d.tried.push_back(p + "." + t);
    for (FoundContainer& c : sub->containers) {
      c.path = p + "." + c.path;
      for (auto& layer : c.layers) layer.first = p + "." + layer.first;
      d.containers.push_back(std::move(c));
    }
    d.inner_path = sub->inner_path.empty() ? p : p + "." + sub->inner_path;
    return d;
  }
  return absl::NotFoundError(absl::StrCat("no layer container in ", d.class_name,
                                          ": it is a registered retrieval wrapper but none of its inner model "
                                          "paths exists; tried: ",
                                          joinNames(d.tried)));
}

absl::StatusOr<FoundLayers> registered(const Subtree& tree, const ModelRegistry& registry, FoundLayers d,
                                       const RegistryEntry& entry) {
  std::string language_path, vision_path;
  const ModuleFacts* language = firstContainer(tree, entry.language, d.tried, language_path);
  if (language == nullptr) {
    return absl::NotFoundError(absl::StrCat(
        "no layer container in ", d.class_name, " (registered, family ", entry.family,
        "): none of its language paths is a non-empty ModuleList or numeric-key ModuleDict; tried: ",
        joinNames(d.tried), ". Registered models do not fall back to heuristics: fix the entry in ", registry.file));
  }
  d.containers.push_back(makeContainer(*language, Role::kLanguage, language_path));
  d.how = absl::StrCat("registry: ", d.class_name, " (family ", entry.family, "), language tower at ", language_path);
  if (const ModuleFacts* vision = firstContainer(tree, entry.vision, d.tried, vision_path)) {
    d.containers.push_back(makeContainer(*vision, Role::kVision, vision_path));
    absl::StrAppend(&d.how, ", vision tower at ", vision_path);
  }
  return d;
}

absl::StatusOr<FoundLayers> heuristics(const Subtree& tree, const ModelRegistry& registry, FoundLayers d) {
  std::string path;
  if (const ModuleFacts* found = firstContainer(tree, registry.default_paths, d.tried, path)) {
    d.containers.push_back(makeContainer(*found, Role::kLanguage, path));
    d.how = absl::StrCat("default path ", path);
    return d;
  }
  d.tried.push_back("largest ModuleList / numeric-key ModuleDict");
  const ModuleFacts* best = nullptr;
  int64_t best_params = -1;
  tree.forEachBelow([&](const std::string& relative, const ModuleFacts& m) {
    if (!isLayerContainer(m) || m.parameters <= best_params) return;
    best = &m;
    best_params = m.parameters;
    path = relative;
  });
  if (best == nullptr) {
    return absl::NotFoundError(absl::StrCat("no layer container in ", d.class_name, " (not registered); tried: ",
                                            joinNames(d.tried), " (none found). Register the class in ",
                                            registry.file));
  }
  d.containers.push_back(makeContainer(*best, Role::kLanguage, path));
  d.how = absl::StrCat("largest container ", path, " (", best_params, " parameters)");
  return d;
}

absl::StatusOr<FoundLayers> findIn(const Subtree& tree, const ModelRegistry& registry) {
  FoundLayers d;
  d.class_name = tree.root().class_name;
  if (const auto* inner_paths = registry.retrievalInner(d.class_name)) {
    return throughWrapper(tree, registry, std::move(d), *inner_paths);
  }
  if (const RegistryEntry* entry = registry.find(d.class_name)) return registered(tree, registry, std::move(d), *entry);
  return heuristics(tree, registry, std::move(d));
}

}  // namespace

bool isLayerContainer(const ModuleFacts& module) {
  if (module.children.empty()) return false;
  if (module.kind == ModuleFacts::Kind::kList) return true;
  if (module.kind != ModuleFacts::Kind::kDict) return false;
  for (const std::string& key : module.children) {
    if (!numericKey(key)) return false;
  }
  return true;
}

absl::StatusOr<FoundLayers> findLayers(const ModuleTree& tree, const ModelRegistry& registry) {
  std::map<std::string, const ModuleFacts*> index;
  for (const ModuleFacts& m : tree.modules) index.emplace(m.path, &m);
  if (index.count("") == 0) return absl::InvalidArgumentError("findLayers: the module tree has no root (path \"\")");
  return findIn(Subtree(tree, index, ""), registry);
}

}  // namespace hpac::trainer
