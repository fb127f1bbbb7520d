// hpac/tools/trainer/registry.h
//
// ModelRegistry: the data (tools/trainer/model_registry.yaml) that tells
// container discovery where the layers of known model classes sit, the default
// paths for unregistered classes, the retrieval wrappers to look through, and
// the submodule alias lists that `full` uses per layer. See docs/trainer.md.
//
// Loading is strict like the config: unknown keys, duplicate classes, empty
// path lists and malformed paths fail with file:line:col.
#pragma once

#include "absl/status/statusor.h"

#include <map>
#include <string>
#include <vector>

namespace hpac::trainer {

// The roles a layer container can have in a model.
enum class Role { kLanguage, kVision };
const char* toString(Role role);

struct RegistryEntry {
  std::string class_name;
  std::string family;
  std::vector<std::string> language;  // candidate paths, first valid wins
  std::vector<std::string> vision;    // may be empty
};

// The per-layer submodule names `full` checkpoints (the reference design's 6.2: docs/design.md).
struct AliasLists {
  std::vector<std::string> mlp, attention, norm1, norm2, mtp;
};

struct ModelRegistry {
  std::string file;
  std::vector<std::string> default_paths;
  AliasLists aliases;
  std::map<std::string, RegistryEntry> models;
  std::map<std::string, std::vector<std::string>> retrieval_wrappers;  // class -> inner paths

  const RegistryEntry* find(const std::string& class_name) const;
  const std::vector<std::string>* retrievalInner(const std::string& class_name) const;
};

absl::StatusOr<ModelRegistry> loadRegistry(const std::string& path);
absl::StatusOr<ModelRegistry> parseRegistry(const std::string& text, const std::string& file = "<string>");

// Where the shipped registry is: $HPAC_MODEL_REGISTRY, else model_registry.yaml
// beside the file holding this code or in ../share/hpac/ from it
// (libhpac_config.so: a build tree, the wheel's hpac/share/hpac/; a program that
// links it: the program), else the same from the running binary, else the
// source folder's copy.
std::string defaultRegistryPath();
// Loads the shipped registry once per process (later calls return the same result).
const absl::StatusOr<ModelRegistry>& builtinRegistry();

}  // namespace hpac::trainer
