// hpac/tools/trainer/discovery.h
//
// Layer-container discovery (the reference design's 6.1: docs/design.md) on a libtorch module tree:
// the C++ front end of findLayers (layer_finder.h, which holds the rules): the
// tree's facts in, the found containers mapped back to their modules.
#pragma once

#include "tools/trainer/checkpointable.h"
#include "tools/trainer/layer_finder.h"
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

}  // namespace hpac::trainer
