#include "tools/trainer/registry.h"

#include "tools/trainer/yaml_reader.h"

#include "absl/strings/str_cat.h"

#include <dlfcn.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>

namespace hpac::trainer {
namespace {

bool validPath(const std::string& path) {
  if (path.empty() || path.front() == '.' || path.back() == '.') return false;
  for (size_t i = 0; i < path.size(); ++i) {
    const char c = path[i];
    if (c == '.' && path[i + 1] == '.') return false;
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '.')) return false;
  }
  return true;
}

class RegistryParser {
 public:
  explicit RegistryParser(const std::string& file) : r_(file) {}

  absl::StatusOr<ModelRegistry> parse(const YAML::Node& root) {
    ModelRegistry reg;
    reg.file = r_.file();
    if (auto s = r_.checkMap(root, "<top level>", {"default_paths", "aliases", "retrieval_wrappers", "models"});
        !s.ok()) {
      return s;
    }
    for (const char* required : {"default_paths", "aliases", "models"}) {
      if (!root[required]) return r_.error(root, required, "missing; the registry needs default_paths, aliases, models");
    }
    auto defaults = paths(root["default_paths"], "default_paths");
    if (!defaults.ok()) return defaults.status();
    reg.default_paths = *defaults;

    const YAML::Node aliases = root["aliases"];
    if (auto s = r_.checkMap(aliases, "aliases", {"mlp", "attention", "norm1", "norm2", "mtp"}); !s.ok()) return s;
    const std::pair<const char*, std::vector<std::string>*> alias_fields[] = {
        {"mlp", &reg.aliases.mlp},     {"attention", &reg.aliases.attention}, {"norm1", &reg.aliases.norm1},
        {"norm2", &reg.aliases.norm2}, {"mtp", &reg.aliases.mtp}};
    for (const auto& [key, field] : alias_fields) {
      if (!aliases[key]) continue;
      auto names = r_.stringList(aliases[key], absl::StrCat("aliases.", key));
      if (!names.ok()) return names.status();
      *field = *names;
    }

    if (root["retrieval_wrappers"]) {
      const YAML::Node wrappers = root["retrieval_wrappers"];
      if (!wrappers.IsSequence()) return r_.error(wrappers, "retrieval_wrappers", "expected a list of {class, inner}");
      for (size_t i = 0; i < wrappers.size(); ++i) {
        const std::string key = absl::StrCat("retrieval_wrappers[", i, "]");
        if (auto s = r_.checkMap(wrappers[i], key, {"class", "inner"}); !s.ok()) return s;
        auto cls = className(wrappers[i], key);
        if (!cls.ok()) return cls.status();
        if (!wrappers[i]["inner"]) return r_.error(wrappers[i], key + ".inner", "missing");
        auto inner = paths(wrappers[i]["inner"], key + ".inner");
        if (!inner.ok()) return inner.status();
        if (!reg.retrieval_wrappers.emplace(*cls, *inner).second) {
          return r_.error(wrappers[i]["class"], key + ".class", absl::StrCat("'", *cls, "' is listed twice"));
        }
      }
    }

    const YAML::Node models = root["models"];
    if (!models.IsSequence()) return r_.error(models, "models", "expected a list of {class, family, language, vision}");
    for (size_t i = 0; i < models.size(); ++i) {
      const std::string key = absl::StrCat("models[", i, "]");
      if (auto s = r_.checkMap(models[i], key, {"class", "family", "language", "vision"}); !s.ok()) return s;
      RegistryEntry entry;
      auto cls = className(models[i], key);
      if (!cls.ok()) return cls.status();
      entry.class_name = *cls;
      if (!models[i]["family"]) return r_.error(models[i], key + ".family", "missing");
      auto family = r_.scalar(models[i]["family"], key + ".family");
      if (!family.ok()) return family.status();
      entry.family = *family;
      if (!models[i]["language"]) return r_.error(models[i], key + ".language", "missing (every model has a language tower)");
      auto language = paths(models[i]["language"], key + ".language");
      if (!language.ok()) return language.status();
      entry.language = *language;
      if (models[i]["vision"]) {
        auto vision = paths(models[i]["vision"], key + ".vision");
        if (!vision.ok()) return vision.status();
        entry.vision = *vision;
      }
      if (reg.models.count(entry.class_name) || reg.retrieval_wrappers.count(entry.class_name)) {
        return r_.error(models[i]["class"], key + ".class", absl::StrCat("'", entry.class_name, "' is listed twice"));
      }
      reg.models.emplace(entry.class_name, entry);
    }
    return reg;
  }

 private:
  absl::StatusOr<std::string> className(const YAML::Node& node, const std::string& key) {
    if (!node["class"]) return r_.error(node, key + ".class", "missing");
    auto cls = r_.scalar(node["class"], key + ".class");
    if (cls.ok() && cls->empty()) return r_.error(node["class"], key + ".class", "empty class name");
    return cls;
  }

  absl::StatusOr<std::vector<std::string>> paths(const YAML::Node& node, const std::string& key) {
    auto list = r_.stringList(node, key);
    if (!list.ok()) return list.status();
    if (list->empty()) return r_.error(node, key, "empty list; give at least one dotted module path");
    for (size_t i = 0; i < list->size(); ++i) {
      if (!validPath((*list)[i])) {
        return r_.error(node[i], absl::StrCat(key, "[", i, "]"),
                        absl::StrCat("'", (*list)[i], "' is not a module path; allowed: names of letters, digits and _ "
                                     "joined by '.' (e.g. model.language_model.layers)"));
      }
    }
    return list;
  }

  YamlReader r_;
};

bool readable(const std::string& path) { return std::ifstream(path).good(); }

}  // namespace

const char* toString(Role role) { return role == Role::kVision ? "vision" : "language"; }

const RegistryEntry* ModelRegistry::find(const std::string& class_name) const {
  auto it = models.find(class_name);
  return it == models.end() ? nullptr : &it->second;
}

const std::vector<std::string>* ModelRegistry::retrievalInner(const std::string& class_name) const {
  auto it = retrieval_wrappers.find(class_name);
  return it == retrieval_wrappers.end() ? nullptr : &it->second;
}

absl::StatusOr<ModelRegistry> loadRegistry(const std::string& path) {
  auto root = loadYamlFile(path);
  if (!root.ok()) return root.status();
  return RegistryParser(path).parse(*root);
}

absl::StatusOr<ModelRegistry> parseRegistry(const std::string& text, const std::string& file) {
  auto root = loadYamlString(text, file);
  if (!root.ok()) return root.status();
  return RegistryParser(file).parse(*root);
}

namespace {

// model_registry.yaml beside the file `file` names, or in ../share/hpac/ from it (cmake --install's layout, and the
// wheel's hpac/lib -> hpac/share/hpac); empty if neither is readable.
std::string registryNear(const std::string& file) {
  const std::string dir = file.substr(0, file.find_last_of('/'));
  for (const std::string& candidate : {dir + "/model_registry.yaml", dir + "/../share/hpac/model_registry.yaml"}) {
    if (readable(candidate)) return candidate;
  }
  return "";
}

}  // namespace

std::string defaultRegistryPath() {
  if (const char* env = std::getenv("HPAC_MODEL_REGISTRY"); env != nullptr && *env != '\0') return env;
  // The file holding this code first: libhpac_config.so loaded by hpac.hf (a build tree, the wheel), whose Python
  // interpreter's prefix may hold another install's registry; for a program that links it, the program itself.
  Dl_info self;
  if (dladdr(reinterpret_cast<void*>(&defaultRegistryPath), &self) != 0 && self.dli_fname != nullptr &&
      self.dli_fname[0] == '/') {
    if (std::string near = registryNear(self.dli_fname); !near.empty()) return near;
  }
  char exe[4096];
  const ssize_t n = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
  if (n > 0) {
    if (std::string near = registryNear(std::string(exe, static_cast<size_t>(n))); !near.empty()) return near;
  }
  return HPAC_TRAINER_SOURCE_REGISTRY;
}

const absl::StatusOr<ModelRegistry>& builtinRegistry() {
  static const absl::StatusOr<ModelRegistry> registry = loadRegistry(defaultRegistryPath());
  return registry;
}

}  // namespace hpac::trainer
