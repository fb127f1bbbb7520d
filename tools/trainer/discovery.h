// hpac/tools/trainer/discovery.h
//
// Layer-container discovery (reference design 6.1). A layer container is a
// non-empty torch::nn::ModuleList or a ModuleDict whose keys are all
// non-negative integers (a pipeline stage); a ModuleDict with any other key is
// never taken. In order:
//   1. Retrieval wrapper (registry `retrieval_wrappers`): recurse into the first
//      inner path that exists; the inner model's containers are reported with
//      the wrapper's prefix.
//   2. Registered class (registry `models`, by torch::nn::Module::name()): per
//      role (language, vision) the first listed path that is a container.
//      Registered models never fall back to the heuristics: no language
//      container is an error.
//   3. The registry's default paths (model.layers, then layers).
//   4. The largest container anywhere in the tree, by parameter count (a layer
//      stack holds all its layers' nested lists, so it outweighs them); ties go
//      to the first in registration order.
// Nothing found: an error that lists every path tried.
#pragma once

#include "tools/trainer/checkpointable.h"
#include "tools/trainer/registry.h"

#include "absl/status/statusor.h"

#include <torch/nn/module.h>

#include <memory>
#include <string>
#include <vector>

namespace hpac::trainer {

struct LayerRef {
  std::string path;  // full dotted path from the root, e.g. model.layers.3
  int64_t index = 0;  // position in a ModuleList, or the numeric ModuleDict key
  std::shared_ptr<torch::nn::Module> module;
  CheckpointableLayer* checkpointable = nullptr;  // null: the layer has no seam
};

struct LayerContainer {
  Role role = Role::kLanguage;
  std::string path;
  std::vector<LayerRef> layers;
};

struct Discovery {
  std::string class_name;  // of the root module
  std::string how;         // "registry: ...", "default path ...", "largest container ...", with wrapper prefix
  std::vector<LayerContainer> containers;  // language first
  std::vector<std::string> tried;          // every path looked at, in order

  const LayerContainer* language() const;
  const LayerContainer* vision() const;
};

absl::StatusOr<Discovery> discoverLayers(torch::nn::Module& root, const ModelRegistry& registry);

// The module at a dotted path below `root`, or null.
std::shared_ptr<torch::nn::Module> resolvePath(torch::nn::Module& root, const std::string& path);
// Non-empty ModuleList or numeric-key ModuleDict.
bool isLayerContainer(const torch::nn::Module& module);

}  // namespace hpac::trainer
