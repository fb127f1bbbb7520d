#include "tools/trainer/discovery.h"

#include "tools/trainer/yaml_reader.h"  // joinNames

#include "absl/strings/str_cat.h"

#include <torch/nn/modules/container/moduledict.h>
#include <torch/nn/modules/container/modulelist.h>

#include <sstream>

namespace hpac::trainer {
namespace {

bool numericKey(const std::string& key) {
  return !key.empty() && key.size() <= 9 && key.find_first_not_of("0123456789") == std::string::npos;
}

int64_t parameterCount(const torch::nn::Module& module) {
  int64_t n = 0;
  for (const at::Tensor& p : module.parameters()) n += p.numel();
  return n;
}

LayerContainer makeContainer(const std::shared_ptr<torch::nn::Module>& module, Role role, const std::string& path) {
  LayerContainer c;
  c.role = role;
  c.path = path;
  const bool is_list = dynamic_cast<const torch::nn::ModuleListImpl*>(module.get()) != nullptr;
  int64_t position = 0;
  for (const auto& child : module->named_children()) {
    LayerRef ref;
    ref.path = path + "." + child.key();
    ref.index = is_list ? position : std::stoll(child.key());
    ref.module = child.value();
    ref.checkpointable = dynamic_cast<CheckpointableLayer*>(child.value().get());
    c.layers.push_back(std::move(ref));
    ++position;
  }
  return c;
}

// The first path in `paths` that is a layer container, recording every path tried.
std::shared_ptr<torch::nn::Module> firstContainer(torch::nn::Module& root, const std::vector<std::string>& paths,
                                                  std::vector<std::string>& tried, std::string& found) {
  for (const std::string& p : paths) {
    tried.push_back(p);
    auto m = resolvePath(root, p);
    if (m && isLayerContainer(*m)) {
      found = p;
      return m;
    }
  }
  return nullptr;
}

}  // namespace

const LayerContainer* Discovery::language() const {
  for (const auto& c : containers) {
    if (c.role == Role::kLanguage) return &c;
  }
  return nullptr;
}

const LayerContainer* Discovery::vision() const {
  for (const auto& c : containers) {
    if (c.role == Role::kVision) return &c;
  }
  return nullptr;
}

std::shared_ptr<torch::nn::Module> resolvePath(torch::nn::Module& root, const std::string& path) {
  std::shared_ptr<torch::nn::Module> current;
  torch::nn::Module* at = &root;
  std::stringstream parts(path);
  std::string part;
  while (std::getline(parts, part, '.')) {
    const auto children = at->named_children();
    const auto* child = children.find(part);
    if (child == nullptr) return nullptr;
    current = *child;
    at = current.get();
  }
  return current;
}

bool isLayerContainer(const torch::nn::Module& module) {
  if (dynamic_cast<const torch::nn::ModuleListImpl*>(&module) != nullptr) return !module.children().empty();
  if (dynamic_cast<const torch::nn::ModuleDictImpl*>(&module) != nullptr) {
    const auto children = module.named_children();
    if (children.is_empty()) return false;
    for (const auto& item : children) {
      if (!numericKey(item.key())) return false;
    }
    return true;
  }
  return false;
}

absl::StatusOr<Discovery> discoverLayers(torch::nn::Module& root, const ModelRegistry& registry) {
  Discovery d;
  d.class_name = root.name();

  if (const auto* inner_paths = registry.retrievalInner(d.class_name)) {
    for (const std::string& p : *inner_paths) {
      d.tried.push_back(p);
      auto inner = resolvePath(root, p);
      if (!inner) continue;
      auto sub = discoverLayers(*inner, registry);
      if (!sub.ok()) {
        return absl::NotFoundError(absl::StrCat("retrieval wrapper ", d.class_name, " -> ", p, ": ",
                                                sub.status().message()));
      }
      d.how = absl::StrCat("retrieval wrapper ", d.class_name, " -> inner model '", p, "' (", sub->class_name,
                           "): ", sub->how);
      for (std::string& t : sub->tried) d.tried.push_back(p + "." + t);
      for (LayerContainer& c : sub->containers) {
        c.path = p + "." + c.path;
        for (LayerRef& l : c.layers) l.path = p + "." + l.path;
        d.containers.push_back(std::move(c));
      }
      return d;
    }
    return absl::NotFoundError(absl::StrCat("no layer container in ", d.class_name,
                                            ": it is a registered retrieval wrapper but none of its inner model "
                                            "paths exists; tried: ",
                                            joinNames(d.tried)));
  }

  if (const RegistryEntry* entry = registry.find(d.class_name)) {
    std::string language_path, vision_path;
    auto language = firstContainer(root, entry->language, d.tried, language_path);
    if (!language) {
      return absl::NotFoundError(absl::StrCat(
          "no layer container in ", d.class_name, " (registered, family ", entry->family,
          "): none of its language paths is a non-empty ModuleList or numeric-key ModuleDict; tried: ",
          joinNames(d.tried), ". Registered models do not fall back to heuristics: fix the entry in ",
          registry.file));
    }
    d.containers.push_back(makeContainer(language, Role::kLanguage, language_path));
    d.how = absl::StrCat("registry: ", d.class_name, " (family ", entry->family, "), language tower at ",
                         language_path);
    if (auto vision = firstContainer(root, entry->vision, d.tried, vision_path)) {
      d.containers.push_back(makeContainer(vision, Role::kVision, vision_path));
      absl::StrAppend(&d.how, ", vision tower at ", vision_path);
    }
    return d;
  }

  std::string path;
  if (auto found = firstContainer(root, registry.default_paths, d.tried, path)) {
    d.containers.push_back(makeContainer(found, Role::kLanguage, path));
    d.how = absl::StrCat("default path ", path);
    return d;
  }

  d.tried.push_back("largest ModuleList / numeric-key ModuleDict");
  std::shared_ptr<torch::nn::Module> best;
  int64_t best_params = -1;
  for (const auto& item : root.named_modules("", /*include_self=*/false)) {
    if (!isLayerContainer(*item.value())) continue;
    const int64_t n = parameterCount(*item.value());
    if (n > best_params) {
      best = item.value();
      best_params = n;
      path = item.key();
    }
  }
  if (!best) {
    return absl::NotFoundError(absl::StrCat("no layer container in ", d.class_name,
                                            " (not registered); tried: ", joinNames(d.tried),
                                            " (none found). Register the class in ", registry.file));
  }
  d.containers.push_back(makeContainer(best, Role::kLanguage, path));
  d.how = absl::StrCat("largest container ", path, " (", best_params, " parameters)");
  return d;
}

}  // namespace hpac::trainer
