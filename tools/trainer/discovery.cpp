#include "tools/trainer/discovery.h"

#include <torch/nn/modules/container/moduledict.h>
#include <torch/nn/modules/container/modulelist.h>

#include <sstream>

namespace hpac::trainer {
namespace {

int64_t parameterCount(const torch::nn::Module& module) {
  int64_t n = 0;
  for (const at::Tensor& p : module.parameters()) n += p.numel();
  return n;
}

ModuleFacts::Kind kindOf(const torch::nn::Module& module) {
  if (dynamic_cast<const torch::nn::ModuleListImpl*>(&module) != nullptr) return ModuleFacts::Kind::kList;
  if (dynamic_cast<const torch::nn::ModuleDictImpl*>(&module) != nullptr) return ModuleFacts::Kind::kDict;
  return ModuleFacts::Kind::kOther;
}

ModuleFacts factsOf(const std::string& path, const torch::nn::Module& module) {
  ModuleFacts m;
  m.path = path;
  m.class_name = module.name();
  m.kind = kindOf(module);
  for (const auto& child : module.named_children()) m.children.push_back(child.key());
  if (isLayerContainer(m)) m.parameters = parameterCount(module);
  return m;
}

// The facts findLayers reads, for every module of the tree (the root may live on the stack: it is not asked for a
// shared_ptr of itself).
ModuleTree treeOf(const torch::nn::Module& root) {
  ModuleTree tree;
  tree.modules.push_back(factsOf("", root));
  for (const auto& item : root.named_modules("", /*include_self=*/false)) {
    tree.modules.push_back(factsOf(item.key(), *item.value()));
  }
  return tree;
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

absl::StatusOr<Discovery> discoverLayers(torch::nn::Module& root, const ModelRegistry& registry) {
  auto found = findLayers(treeOf(root), registry);
  if (!found.ok()) return found.status();
  Discovery d;
  d.class_name = found->class_name;
  d.how = found->how;
  d.tried = found->tried;
  for (const FoundContainer& fc : found->containers) {
    LayerContainer c;
    c.role = fc.role;
    c.path = fc.path;
    for (const auto& [path, index] : fc.layers) {
      LayerRef ref;
      ref.path = path;
      ref.index = index;
      ref.module = resolvePath(root, path);
      ref.checkpointable = dynamic_cast<CheckpointableLayer*>(ref.module.get());
      c.layers.push_back(std::move(ref));
    }
    d.containers.push_back(std::move(c));
  }
  return d;
}

}  // namespace hpac::trainer
