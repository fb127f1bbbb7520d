// hpac/tools/trainer/config_ops.cpp
//
// libhpac_config.so: the trainer's YAML parsers (config.h, registry.h) as torch
// ops, for the Python integration (plugin/python/hpac/hf.py). There is one
// parser: Python never reads the YAML itself, it gets the validated result as
// JSON, and every rejection arrives as a RuntimeError carrying the parser's
// "file:line:col: key: message".
//
//   torch.ops.hpac_config.load_config(path) -> str              JSON of TrainConfig
//   torch.ops.hpac_config.parse_config(text, file) -> str       same, from text
//   torch.ops.hpac_config.load_registry(path) -> str            JSON of ModelRegistry ("" = the shipped one)
//   torch.ops.hpac_config.default_registry_path() -> str
//   torch.ops.hpac_config.find_layers(tree) -> str          JSON of the layers findLayers finds in a JSON
//                                                            module tree (layer_finder.h, route_plan_json.h)
//   torch.ops.hpac_config.plan_routes(facts) -> str          JSON of the RoutePlan for JSON route facts
//                                                            (route_plan.h, route_plan_json.h)
//
// Note [Config JSON]: the JSON mirrors the C++ structs field by field (names as
// in config.h / registry.h), so a Python reader and the C++ trainer see the same
// values; effective_summary carries effectiveSummary() for comparisons.
#include "tools/trainer/config.h"
#include "tools/trainer/registry.h"
#include "tools/trainer/route_plan_json.h"

#include "policy/text_format.h"

#include "absl/strings/str_cat.h"

#include <torch/library.h>

#include <cstdio>
#include <string>
#include <vector>

namespace hpac::trainer {
namespace {

std::string quote(const std::string& s) { return jsonString(s); }

std::string number(double v) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.17g", v);
  return buf;
}

const char* boolean(bool b) { return b ? "true" : "false"; }

std::string configJson(const TrainConfig& c) {
  const ModelSpec& m = c.model;
  std::string out = absl::StrCat("{\"file\": ", quote(c.file), ", \"model\": {\"preset\": ", quote(m.preset),
                                 ", \"num_layers\": ", m.num_layers, ", \"hidden_size\": ", m.hidden_size,
                                 ", \"num_attention_heads\": ", m.num_attention_heads,
                                 ", \"num_key_value_heads\": ", m.num_key_value_heads, ", \"head_dim\": ", m.head_dim,
                                 ", \"intermediate_size\": ", m.intermediate_size,
                                 ", \"moe_intermediate_size\": ", m.moe_intermediate_size,
                                 ", \"num_experts\": ", m.num_experts, ", \"num_experts_per_tok\": ",
                                 m.num_experts_per_tok, ", \"vocab_size\": ", m.vocab_size,
                                 ", \"num_kv_shared_layers\": ", m.num_kv_shared_layers);
  absl::StrAppend(&out, ", \"norm_topk_prob\": ", boolean(m.norm_topk_prob), ", \"rope_theta\": ",
                  number(m.rope_theta), ", \"rms_norm_eps\": ", number(m.rms_norm_eps), "}");
  const TrainSpec& t = c.train;
  absl::StrAppend(&out, ", \"train\": {\"seq_len\": ", t.seq_len, ", \"micro_batch\": ", t.micro_batch,
                  ", \"steps\": ", t.steps, ", \"lr\": ", number(t.lr), ", \"weight_decay\": ", number(t.weight_decay),
                  ", \"seed\": ", t.seed, ", \"dtype\": ", quote(t.dtype), ", \"compile\": ", boolean(t.compile), "}");
  const ActivationCheckpointSpec& ac = c.activation_checkpoint;
  absl::StrAppend(&out, ", \"activation_checkpoint\": {\"mode\": ", quote(toString(ac.mode)), ", \"routing\": ",
                  quote(toString(ac.routing)), ", \"state_writes\": ", quote(toString(ac.state_writes)),
                  ", \"policy\": ", quote(ac.policy), ", \"policy_params\": [");
  for (size_t i = 0; i < ac.policy_params.size(); ++i) absl::StrAppend(&out, i ? ", " : "", quote(ac.policy_params[i]));
  absl::StrAppend(&out, "], \"layers\": [");
  for (size_t i = 0; i < ac.layers.size(); ++i) {
    const LayerRange& r = ac.layers[i];
    absl::StrAppend(&out, i ? ", " : "", "{\"first\": ", r.first, ", \"last\": ", r.last, ", \"mode\": ",
                    quote(toString(r.mode)), ", \"where\": ", quote(r.where), "}");
  }
  absl::StrAppend(&out, "], \"cost\": ", quote(ac.cost), ", \"memory_budget\": ");
  if (ac.memory_budget) {
    const MemoryBudget& b = *ac.memory_budget;
    absl::StrAppend(&out, "{\"fraction\": ", b.fraction >= 0 ? number(b.fraction) : std::string("null"),
                    ", \"bytes\": ", b.bytes >= 0 ? absl::StrCat(b.bytes) : std::string("null"), ", \"text\": ",
                    quote(b.text), ", \"where\": ", quote(b.where), "}");
  } else {
    out += "null";
  }
  absl::StrAppend(&out, ", \"memory_target\": ");
  if (ac.memory_target) {
    const MemoryBudget& t = *ac.memory_target;
    absl::StrAppend(&out, "{\"bytes\": ", t.bytes, ", \"text\": ", quote(t.text), ", \"where\": ", quote(t.where), "}");
  } else {
    out += "null";
  }
  absl::StrAppend(&out, ", \"plan\": ");
  if (ac.plan) {
    absl::StrAppend(&out, "{\"path\": ", quote(*ac.plan), ", \"where\": ", quote(ac.plan_where), "}");
  } else {
    out += "null";
  }
  absl::StrAppend(&out, "}, \"activation_swap\": ", quote(toString(c.activation_swap)));
  const ParallelSpec& p = c.parallel;
  absl::StrAppend(&out, ", \"parallel\": {\"tp\": ", p.tp, ", \"dp\": ", p.dp, ", \"ep\": ", p.ep, ", \"cp\": ", p.cp, ", \"fsdp\": ",
                  boolean(p.fsdp), "}, \"effective_summary\": ", quote(effectiveSummary(c)), "}");
  return out;
}

std::string registryJson(const ModelRegistry& r) {
  const AliasLists& a = r.aliases;
  std::string out = absl::StrCat("{\"file\": ", quote(r.file), ", \"default_paths\": ", jsonStringList(r.default_paths),
                                 ", \"aliases\": {\"mlp\": ", jsonStringList(a.mlp), ", \"attention\": ",
                                 jsonStringList(a.attention), ", \"norm1\": ", jsonStringList(a.norm1), ", \"norm2\": ",
                                 jsonStringList(a.norm2), ", \"mtp\": ", jsonStringList(a.mtp), "}, \"retrieval_wrappers\": {");
  bool first = true;
  for (const auto& [cls, inner] : r.retrieval_wrappers) {
    absl::StrAppend(&out, first ? "" : ", ", quote(cls), ": ", jsonStringList(inner));
    first = false;
  }
  absl::StrAppend(&out, "}, \"models\": {");
  first = true;
  for (const auto& [cls, e] : r.models) {
    absl::StrAppend(&out, first ? "" : ", ", quote(cls), ": {\"family\": ", quote(e.family), ", \"language\": ",
                    jsonStringList(e.language), ", \"vision\": ", jsonStringList(e.vision), "}");
    first = false;
  }
  return out + "}}";
}

template <typename T>
const T& valueOrThrow(const absl::StatusOr<T>& result) {
  TORCH_CHECK(result.ok(), std::string(result.status().message()));
  return *result;
}

std::string loadConfigOp(std::string path) { return configJson(valueOrThrow(loadConfig(path))); }

std::string parseConfigOp(std::string text, std::string file) {
  return configJson(valueOrThrow(parseConfig(text, file)));
}

std::string loadRegistryOp(std::string path) {
  return registryJson(valueOrThrow(loadRegistry(path.empty() ? defaultRegistryPath() : path)));
}

std::string defaultRegistryPathOp() { return defaultRegistryPath(); }

std::string findLayersOp(std::string tree_json) {
  const auto parsed = moduleTreeFromJson(tree_json);
  const auto& [tree, registry] = valueOrThrow(parsed);
  return foundLayersJson(valueOrThrow(findLayers(tree, registry)));
}

std::string planRoutesOp(std::string facts_json) {
  return routePlanJson(valueOrThrow(planRoutes(valueOrThrow(routeFactsFromJson(facts_json)))));
}

// The versions of the libraries this library was built with (CMake's find_package; the wheel bundles them).
std::string builtWithOp() {
  return std::string("yaml-cpp ") + HPAC_YAML_CPP_VERSION + ", abseil " + HPAC_ABSL_VERSION;
}

}  // namespace

TORCH_LIBRARY(hpac_config, m) {
  m.def("built_with() -> str", &builtWithOp);
  m.def("load_config(str path) -> str", &loadConfigOp);
  m.def("parse_config(str text, str file) -> str", &parseConfigOp);
  m.def("load_registry(str path) -> str", &loadRegistryOp);
  m.def("default_registry_path() -> str", &defaultRegistryPathOp);
  m.def("find_layers(str tree) -> str", &findLayersOp);
  m.def("plan_routes(str facts) -> str", &planRoutesOp);
}

}  // namespace hpac::trainer
