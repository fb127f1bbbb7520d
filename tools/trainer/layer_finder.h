// hpac/tools/trainer/layer_finder.h
//
// Layer-container discovery (the reference design's 6.1: docs/design.md) as one pure function over a
// module tree's facts: both front ends (discovery.cpp over libtorch modules,
// hpac.hf.discover over Python modules, through torch.ops.hpac_config.find_layers)
// flatten their tree into a ModuleTree, call findLayers, and map the paths it
// returns back to their modules. A layer container is a non-empty ModuleList or
// a ModuleDict whose keys are all non-negative integers (a pipeline stage); a
// ModuleDict with any other key is never taken. In order:
//   1. Retrieval wrapper (registry `retrieval_wrappers`): recurse into the first
//      inner path that exists; the inner model's containers are reported with
//      the wrapper's prefix.
//   2. Registered class (registry `models`, by class name): per role (language,
//      vision) the first listed path that is a container. Registered models
//      never fall back to the heuristics: no language container is an error.
//   3. The registry's default paths (model.layers, then layers).
//   4. The largest container anywhere in the tree, by parameter count (a layer
//      stack holds all its layers' nested lists, so it outweighs them); ties go
//      to the first in registration order.
// Nothing found: NotFound listing every path tried.
#pragma once

#include "tools/trainer/registry.h"

#include "absl/status/statusor.h"

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace hpac::trainer {

// One module of the tree.
struct ModuleFacts {
  enum class Kind { kOther, kList, kDict };
  std::string path;        // dotted, from the root ("" for the root)
  std::string class_name;  // the Hugging Face class name discovery looks up in the registry
  Kind kind = Kind::kOther;
  std::vector<std::string> children;  // child names, in registration order
  int64_t parameters = 0;             // parameter count; read for containers only
};

// Every module, root first, in registration (pre-)order, as named_modules lists them.
struct ModuleTree {
  std::vector<ModuleFacts> modules;
};

// Non-empty ModuleList or numeric-key ModuleDict.
bool isLayerContainer(const ModuleFacts& module);

struct FoundContainer {
  Role role = Role::kLanguage;
  std::string path;
  std::vector<std::pair<std::string, int64_t>> layers;  // (path, index in the list or numeric ModuleDict key)
};

struct FoundLayers {
  std::string class_name;  // of the root
  std::string how;         // "registry: ...", "default path ...", "largest container ...", with wrapper prefix
  std::vector<FoundContainer> containers;  // language first
  std::vector<std::string> tried;          // every path looked at, in order
  std::string inner_path;  // the model reached through retrieval wrappers ("" for the root)
};

absl::StatusOr<FoundLayers> findLayers(const ModuleTree& tree, const ModelRegistry& registry);

}  // namespace hpac::trainer
