// hpac/tools/trainer/yaml_reader.h
//
// YamlReader: strict reading of YAML documents (the trainer config and the model
// registry). Every error names the file, line and column (1-based, from
// YAML::Node::Mark()), the key path, the bad value and what is allowed:
//
//   train.yaml:7:9: activation_checkpoint.mode: 'fast' is not allowed; allowed: off, full, selective
//
// yaml-cpp keeps scalars as strings (YAML 1.2 core schema), so `mode: off` reads
// as the string "off" and never as a boolean; booleans are exactly true/false.
//
// Not on the dispatcher path: failures are absl::Status (InvalidArgument,
// NotFound for a missing file).
#pragma once

#include <yaml-cpp/yaml.h>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

#include <cstdint>
#include <string>
#include <vector>

namespace hpac::trainer {

// Parses `path`; a syntax error names file, line and column.
absl::StatusOr<YAML::Node> loadYamlFile(const std::string& path);
// Parses `text`; errors name `file` (e.g. "<string>").
absl::StatusOr<YAML::Node> loadYamlString(const std::string& text, const std::string& file);

class YamlReader {
 public:
  explicit YamlReader(std::string file) : file_(std::move(file)) {}

  const std::string& file() const { return file_; }
  // "file:line:col" of `node`.
  std::string where(const YAML::Node& node) const;
  // InvalidArgument "file:line:col: key: message".
  absl::Status error(const YAML::Node& node, const std::string& key, const std::string& message) const;

  // `node` must be a map whose keys are all in `allowed`; `section` is its key path.
  absl::Status checkMap(const YAML::Node& node, const std::string& section,
                        const std::vector<std::string>& allowed) const;
  absl::StatusOr<std::string> scalar(const YAML::Node& node, const std::string& key) const;
  absl::StatusOr<std::string> oneOf(const YAML::Node& node, const std::string& key,
                                    const std::vector<std::string>& allowed) const;
  absl::StatusOr<int64_t> integer(const YAML::Node& node, const std::string& key, int64_t min, int64_t max) const;
  // A finite number above `min` (or equal to it when `min_inclusive`).
  absl::StatusOr<double> number(const YAML::Node& node, const std::string& key, double min,
                                bool min_inclusive = false) const;
  absl::StatusOr<bool> boolean(const YAML::Node& node, const std::string& key) const;
  // A sequence of non-empty strings.
  absl::StatusOr<std::vector<std::string>> stringList(const YAML::Node& node, const std::string& key) const;

 private:
  std::string file_;
};

}  // namespace hpac::trainer
