#include "tools/trainer/yaml_reader.h"

#include "policy/text_format.h"

#include "absl/strings/str_cat.h"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <sstream>

namespace hpac::trainer {
namespace {

const char* typeName(const YAML::Node& node) {
  switch (node.Type()) {
    case YAML::NodeType::Null: return "null";
    case YAML::NodeType::Scalar: return "scalar";
    case YAML::NodeType::Sequence: return "sequence";
    case YAML::NodeType::Map: return "map";
    default: return "undefined";
  }
}

absl::StatusOr<YAML::Node> parse(const std::string& text, const std::string& file) {
  try {
    return YAML::Load(text);
  } catch (const YAML::ParserException& e) {
    return absl::InvalidArgumentError(
        absl::StrCat(file, ":", e.mark.line + 1, ":", e.mark.column + 1, ": YAML syntax error: ", e.msg));
  }
}

}  // namespace

absl::StatusOr<YAML::Node> loadYamlFile(const std::string& path) {
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat(path, ": cannot open the file"));
  std::stringstream text;
  text << in.rdbuf();
  return parse(text.str(), path);
}

absl::StatusOr<YAML::Node> loadYamlString(const std::string& text, const std::string& file) {
  return parse(text, file);
}

std::string YamlReader::where(const YAML::Node& node) const {
  const YAML::Mark mark = node.Mark();
  // A null document (empty, or comments only) has no mark: point at its start.
  if (mark.is_null()) return file_ + ":1:1";
  return absl::StrCat(file_, ":", mark.line + 1, ":", mark.column + 1);
}

absl::Status YamlReader::error(const YAML::Node& node, const std::string& key, const std::string& message) const {
  return absl::InvalidArgumentError(absl::StrCat(where(node), ": ", key, ": ", message));
}

absl::Status YamlReader::checkMap(const YAML::Node& node, const std::string& section,
                                  const std::vector<std::string>& allowed) const {
  if (!node.IsMap()) {
    return error(node, section, absl::StrCat("expected a map, got a ", typeName(node)));
  }
  for (auto it = node.begin(); it != node.end(); ++it) {
    const YAML::Node key = it->first;
    const std::string name = key.IsScalar() ? key.Scalar() : std::string("<") + typeName(key) + ">";
    if (std::find(allowed.begin(), allowed.end(), name) == allowed.end()) {
      return error(key, section,
                   absl::StrCat("unknown key '", name, "'; allowed keys: ", joinNames(allowed)));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> YamlReader::scalar(const YAML::Node& node, const std::string& key) const {
  if (!node.IsScalar()) return error(node, key, absl::StrCat("expected a scalar, got a ", typeName(node)));
  return node.Scalar();
}

absl::StatusOr<std::string> YamlReader::oneOf(const YAML::Node& node, const std::string& key,
                                              const std::vector<std::string>& allowed) const {
  if (!node.IsScalar()) {
    return error(node, key,
                 absl::StrCat("expected one of ", joinNames(allowed), ", got a ", typeName(node)));
  }
  const std::string& value = node.Scalar();
  if (std::find(allowed.begin(), allowed.end(), value) == allowed.end()) {
    return error(node, key, absl::StrCat("'", value, "' is not allowed; allowed: ", joinNames(allowed)));
  }
  return value;
}

absl::StatusOr<int64_t> YamlReader::integer(const YAML::Node& node, const std::string& key, int64_t min,
                                            int64_t max) const {
  if (!node.IsScalar()) return error(node, key, absl::StrCat("expected an integer, got a ", typeName(node)));
  const std::string& text = node.Scalar();
  errno = 0;
  char* end = nullptr;
  const long long value = std::strtoll(text.c_str(), &end, 10);
  if (text.empty() || end != text.c_str() + text.size() || errno == ERANGE) {
    return error(node, key, absl::StrCat("'", text, "' is not an integer; allowed: integers in [", min, ", ", max, "]"));
  }
  if (value < min || value > max) {
    return error(node, key, absl::StrCat("'", text, "' is out of range; allowed: integers in [", min, ", ", max, "]"));
  }
  return static_cast<int64_t>(value);
}

absl::StatusOr<double> YamlReader::number(const YAML::Node& node, const std::string& key, double min,
                                          bool min_inclusive) const {
  const std::string allowed = absl::StrCat("allowed: numbers ", min_inclusive ? ">= " : "> ", min);
  if (!node.IsScalar()) return error(node, key, absl::StrCat("expected a number, got a ", typeName(node)));
  const std::string& text = node.Scalar();
  errno = 0;
  char* end = nullptr;
  const double value = std::strtod(text.c_str(), &end);
  if (text.empty() || end != text.c_str() + text.size() || errno == ERANGE || !std::isfinite(value)) {
    return error(node, key, absl::StrCat("'", text, "' is not a finite number; ", allowed));
  }
  if (min_inclusive ? !(value >= min) : !(value > min)) {
    return error(node, key, absl::StrCat("'", text, "' is out of range; ", allowed));
  }
  return value;
}

absl::StatusOr<bool> YamlReader::boolean(const YAML::Node& node, const std::string& key) const {
  auto text = oneOf(node, key, {"true", "false"});
  if (!text.ok()) return text.status();
  return *text == "true";
}

absl::StatusOr<std::vector<std::string>> YamlReader::stringList(const YAML::Node& node,
                                                                const std::string& key) const {
  if (!node.IsSequence()) return error(node, key, absl::StrCat("expected a list of names, got a ", typeName(node)));
  std::vector<std::string> out;
  for (size_t i = 0; i < node.size(); ++i) {
    const std::string item_key = absl::StrCat(key, "[", i, "]");
    auto value = scalar(node[i], item_key);
    if (!value.ok()) return value.status();
    if (value->empty()) return error(node[i], item_key, "empty name; allowed: non-empty names");
    out.push_back(*value);
  }
  return out;
}

}  // namespace hpac::trainer
