#include "tools/trainer/config.h"

#include "tools/trainer/yaml_reader.h"

#include "policy/policy_kind.h"
#include "policy/byte_size.h"
#include "policy/text_format.h"

#include "absl/strings/str_cat.h"

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <functional>
#include <limits>
#include <map>

namespace hpac::trainer {
namespace {

constexpr int64_t kMaxInt = std::numeric_limits<int32_t>::max();
constexpr const char* kMemoryBudgetAllowed =
    "allowed: a fraction in [0, 1] of what the region keeps with checkpointing off (0.3), or bytes per region with "
    "a unit: B, KiB, MiB, GiB or TiB (64MiB)";


// The policy kinds activation_checkpoint.policy takes: what mode selective can run (policy/policy_kind.h).
const std::vector<std::string>& selectivePolicyKinds() {
  static const std::vector<std::string> kinds = {"selective", "torchtitan", "save_all_but", "save_occurrences",
                                                 "save_list"};
  return kinds;
}

#define HPAC_ASSIGN_OR_RETURN(lhs, expr) \
  {                                      \
    auto status_or = (expr);             \
    if (!status_or.ok()) return status_or.status(); \
    lhs = *std::move(status_or);         \
  }

std::map<std::string, ModelSpec> presets() {
  std::map<std::string, ModelSpec> p;
  ModelSpec tiny;  // the defaults
  p["qwen3_moe_tiny"] = tiny;

  ModelSpec big;  // Qwen3-30B-A3B (../shared/DESIGN.md)
  big.preset = "qwen3_moe_30b_a3b";
  big.num_layers = 48;
  big.hidden_size = 2048;
  big.num_attention_heads = 32;
  big.num_key_value_heads = 4;
  big.head_dim = 128;
  big.intermediate_size = 6144;
  big.moe_intermediate_size = 768;
  big.num_experts = 128;
  big.num_experts_per_tok = 8;
  big.vocab_size = 151936;
  big.norm_topk_prob = true;
  big.rope_theta = 1.0e6;
  big.rms_norm_eps = 1.0e-6;
  p["qwen3_moe_30b_a3b"] = big;

  for (const char* name : {"gpt2_tiny", "pipeline_stage_tiny", "llava_tiny", "gemma3n_kv_tiny", "bi_encoder_tiny",
                           "custom_blocks_tiny"}) {
    ModelSpec s = tiny;
    s.preset = name;
    s.num_layers = 2;
    p[name] = s;
  }
  p["pipeline_stage_tiny"].num_layers = 4;  // the stage holds layers 2 and 3
  p["gemma3n_kv_tiny"].num_layers = 4;
  p["gemma3n_kv_tiny"].num_kv_shared_layers = 2;
  p["custom_blocks_tiny"].num_layers = 3;
  return p;
}

class ConfigParser {
 public:
  explicit ConfigParser(const std::string& file) : r_(file) {}

  absl::StatusOr<TrainConfig> parse(const YAML::Node& root) {
    TrainConfig config;
    config.file = r_.file();
    if (root.IsNull()) return config;  // empty file: every default
    if (auto s = r_.checkMap(root, "<top level>", {"model", "train", "activation_checkpoint", "activation_swap", "parallel"});
        !s.ok()) {
      return s;
    }
    if (root["model"]) {
      if (auto s = parseModel(root["model"], config.model); !s.ok()) return s;
    }
    if (root["train"]) {
      if (auto s = parseTrain(root["train"], config.train); !s.ok()) return s;
    }
    if (root["activation_checkpoint"]) {
      if (auto s = parseCheckpoint(root["activation_checkpoint"], config.model, config.activation_checkpoint);
          !s.ok()) {
        return s;
      }
    }
    if (root["activation_swap"]) {
      std::string swap;
      HPAC_ASSIGN_OR_RETURN(swap, r_.oneOf(root["activation_swap"], "activation_swap", {"none", "attention"}));
      config.activation_swap = swap == "attention" ? ActivationSwap::kAttention : ActivationSwap::kNone;
    }
    if (root["parallel"]) {
      if (auto s = parseParallel(root["parallel"], config); !s.ok()) return s;
    }
    return config;
  }

 private:
  absl::Status parseModel(const YAML::Node& node, ModelSpec& m) {
    const std::vector<std::string> keys = {
        "preset", "num_layers", "hidden_size", "num_attention_heads", "num_key_value_heads", "head_dim",
        "intermediate_size", "moe_intermediate_size", "num_experts", "num_experts_per_tok", "vocab_size",
        "num_kv_shared_layers", "norm_topk_prob", "rope_theta", "rms_norm_eps"};
    if (auto s = r_.checkMap(node, "model", keys); !s.ok()) return s;
    if (node["preset"]) {
      std::string name;
      HPAC_ASSIGN_OR_RETURN(name, r_.oneOf(node["preset"], "model.preset", modelPresetNames()));
      m = presets().at(name);
    }
    const std::map<std::string, int64_t*> ints = {
        {"num_layers", &m.num_layers},
        {"hidden_size", &m.hidden_size},
        {"num_attention_heads", &m.num_attention_heads},
        {"num_key_value_heads", &m.num_key_value_heads},
        {"head_dim", &m.head_dim},
        {"intermediate_size", &m.intermediate_size},
        {"moe_intermediate_size", &m.moe_intermediate_size},
        {"num_experts", &m.num_experts},
        {"num_experts_per_tok", &m.num_experts_per_tok},
        {"vocab_size", &m.vocab_size}};
    for (const auto& [key, field] : ints) {
      if (node[key]) HPAC_ASSIGN_OR_RETURN(*field, r_.integer(node[key], "model." + key, 1, kMaxInt));
    }
    if (node["num_kv_shared_layers"]) {
      HPAC_ASSIGN_OR_RETURN(m.num_kv_shared_layers,
                            r_.integer(node["num_kv_shared_layers"], "model.num_kv_shared_layers", 0, kMaxInt));
    }
    if (node["norm_topk_prob"]) HPAC_ASSIGN_OR_RETURN(m.norm_topk_prob, r_.boolean(node["norm_topk_prob"], "model.norm_topk_prob"));
    if (node["rope_theta"]) HPAC_ASSIGN_OR_RETURN(m.rope_theta, r_.number(node["rope_theta"], "model.rope_theta", 0.0));
    if (node["rms_norm_eps"]) HPAC_ASSIGN_OR_RETURN(m.rms_norm_eps, r_.number(node["rms_norm_eps"], "model.rms_norm_eps", 0.0));

    // Cross-field checks, reported at the key that breaks them.
    auto at = [&](const char* key) { return node[key] ? node[key] : node; };
    if (m.num_attention_heads % m.num_key_value_heads != 0) {
      return r_.error(at("num_key_value_heads"), "model.num_key_value_heads",
                      absl::StrCat("'", m.num_key_value_heads, "' must divide num_attention_heads (",
                                   m.num_attention_heads, ")"));
    }
    if (m.num_experts_per_tok > m.num_experts) {
      return r_.error(at("num_experts_per_tok"), "model.num_experts_per_tok",
                      absl::StrCat("'", m.num_experts_per_tok, "' is out of range; allowed: 1..num_experts (",
                                   m.num_experts, ")"));
    }
    if (m.head_dim % 2 != 0) {
      return r_.error(at("head_dim"), "model.head_dim", absl::StrCat("'", m.head_dim, "' must be even (RoPE)"));
    }
    if (m.num_kv_shared_layers >= m.num_layers) {
      return r_.error(at("num_kv_shared_layers"), "model.num_kv_shared_layers",
                      absl::StrCat("'", m.num_kv_shared_layers, "' is out of range; allowed: 0..", m.num_layers - 1,
                                   " (fewer than num_layers)"));
    }
    return absl::OkStatus();
  }

  absl::Status parseTrain(const YAML::Node& node, TrainSpec& t) {
    if (auto s = r_.checkMap(node, "train",
                             {"seq_len", "micro_batch", "steps", "lr", "weight_decay", "seed", "dtype", "compile"});
        !s.ok()) {
      return s;
    }
    if (node["seq_len"]) HPAC_ASSIGN_OR_RETURN(t.seq_len, r_.integer(node["seq_len"], "train.seq_len", 2, 1 << 20));
    if (node["micro_batch"]) HPAC_ASSIGN_OR_RETURN(t.micro_batch, r_.integer(node["micro_batch"], "train.micro_batch", 1, 1 << 16));
    if (node["steps"]) HPAC_ASSIGN_OR_RETURN(t.steps, r_.integer(node["steps"], "train.steps", 1, 1 << 24));
    if (node["lr"]) HPAC_ASSIGN_OR_RETURN(t.lr, r_.number(node["lr"], "train.lr", 0.0));
    if (node["weight_decay"]) HPAC_ASSIGN_OR_RETURN(t.weight_decay, r_.number(node["weight_decay"], "train.weight_decay", 0.0, true));
    if (node["seed"]) HPAC_ASSIGN_OR_RETURN(t.seed, r_.integer(node["seed"], "train.seed", 0, std::numeric_limits<int64_t>::max()));
    if (node["dtype"]) HPAC_ASSIGN_OR_RETURN(t.dtype, r_.oneOf(node["dtype"], "train.dtype", {"float32", "bfloat16"}));
    if (node["compile"]) HPAC_ASSIGN_OR_RETURN(t.compile, r_.boolean(node["compile"], "train.compile"));
    return absl::OkStatus();
  }

  absl::Status parseParallel(const YAML::Node& node, TrainConfig& config) {
    ParallelSpec& p = config.parallel;
    const ModelSpec& m = config.model;
    if (auto s = r_.checkMap(node, "parallel", {"tp", "dp", "ep", "cp", "fsdp"}); !s.ok()) return s;
    p.where = r_.where(node);
    if (node["tp"]) HPAC_ASSIGN_OR_RETURN(p.tp, r_.integer(node["tp"], "parallel.tp", 1, 64));
    if (node["dp"]) HPAC_ASSIGN_OR_RETURN(p.dp, r_.integer(node["dp"], "parallel.dp", 1, 64));
    if (node["ep"]) HPAC_ASSIGN_OR_RETURN(p.ep, r_.integer(node["ep"], "parallel.ep", 1, 64));
    if (node["cp"]) HPAC_ASSIGN_OR_RETURN(p.cp, r_.integer(node["cp"], "parallel.cp", 1, 64));
    if (node["fsdp"]) HPAC_ASSIGN_OR_RETURN(p.fsdp, r_.boolean(node["fsdp"], "parallel.fsdp"));
    auto at = [&](const char* key) { return node[key] ? node[key] : node; };
    if (p.worldSize() > 64) {
      return r_.error(node, "parallel",
                      absl::StrCat("tp x cp x dp = ", p.worldSize(), " ranks; allowed: at most 64"));
    }
    if (p.tp * p.dp * p.ep * p.cp == 1 && !p.fsdp) return absl::OkStatus();
    if (m.preset.rfind("qwen3_moe", 0) != 0) {
      return r_.error(node, "parallel",
                      absl::StrCat("is implemented for the Qwen3-MoE presets (qwen3_moe_tiny, qwen3_moe_30b_a3b); "
                                   "model.preset is '", m.preset, "'"));
    }
    if (config.train.dtype != "float32") {
      return r_.error(node, "parallel",
                      absl::StrCat("needs train.dtype: float32 (Gloo on this libtorch reduces float32), got '",
                                   config.train.dtype, "'"));
    }
    // Each degree must divide what it splits.
    const std::pair<const char*, int64_t> by_tp[] = {{"num_attention_heads", m.num_attention_heads},
                                                     {"num_key_value_heads", m.num_key_value_heads},
                                                     {"moe_intermediate_size", m.moe_intermediate_size}};
    for (const auto& [name, value] : by_tp) {
      if (value % p.tp != 0) {
        return r_.error(at("tp"), "parallel.tp",
                        absl::StrCat("'", p.tp, "' must divide model.", name, " (", value,
                                     "): tensor parallelism splits it over the tp ranks"));
      }
    }
    // Context parallel (torch's context_parallel) splits each sequence into 2 x cp chunks and gives a rank one
    // from the head and its mirror from the tail, so that causal attention costs every rank alike.
    if (p.cp > 1 && config.train.seq_len % (2 * p.cp) != 0) {
      return r_.error(at("cp"), "parallel.cp",
                      absl::StrCat("'", p.cp, "' with train.seq_len ", config.train.seq_len,
                                   ": context parallel splits each sequence into 2 x cp = ", 2 * p.cp,
                                   " chunks (torch's head-tail load balancing of causal attention); allowed: a cp "
                                   "with train.seq_len divisible by 2 x cp"));
    }
    if (p.dp % p.ep != 0) {
      return r_.error(at("ep"), "parallel.ep",
                      absl::StrCat("'", p.ep, "' must divide parallel.dp (", p.dp,
                                   "): expert-parallel groups are carved out of the data-parallel ranks "
                                   "(the world size is tp x cp x dp = ", p.worldSize(), ")"));
    }
    if (m.num_experts % p.ep != 0) {
      return r_.error(at("ep"), "parallel.ep",
                      absl::StrCat("'", p.ep, "' must divide model.num_experts (", m.num_experts,
                                   "): each expert-parallel rank owns num_experts / ep experts"));
    }
    if (p.fsdp) {
      if (p.dp < 2) {
        return r_.error(at("fsdp"), "parallel.fsdp",
                        absl::StrCat("true shards parameters over the data-parallel ranks, but parallel.dp is ",
                                     p.dp, "; use dp >= 2 or fsdp: false"));
      }
      const int64_t q = m.num_attention_heads / p.tp * m.head_dim * m.hidden_size;
      const int64_t kv = m.num_key_value_heads / p.tp * m.head_dim * m.hidden_size;
      if (q % p.dp != 0 || kv % p.dp != 0) {
        return r_.error(at("dp"), "parallel.dp",
                        absl::StrCat("'", p.dp, "' must divide the size of each attention projection shard (q/o ",
                                     q, ", k/v ", kv, " elements) for fsdp: true"));
      }
    }
    return absl::OkStatus();
  }

  absl::StatusOr<CheckpointMode> mode(const YAML::Node& node, const std::string& key) {
    std::string text;
    HPAC_ASSIGN_OR_RETURN(text, r_.oneOf(node, key, checkpointModeNames()));
    return checkpointModeOrThrow(text);
  }

  absl::Status parseCheckpoint(const YAML::Node& node, const ModelSpec& model, ActivationCheckpointSpec& ac) {
    if (auto s = r_.checkMap(node, "activation_checkpoint",
                             {"mode", "memory_budget", "memory_target", "plan", "layers", "routing", "state_writes",
                              "cost", "policy", "policy_params"});
        !s.ok()) {
      return s;
    }
    if (node["mode"]) HPAC_ASSIGN_OR_RETURN(ac.mode, mode(node["mode"], "activation_checkpoint.mode"));
    std::string rule;
    if (node["routing"]) {
      HPAC_ASSIGN_OR_RETURN(rule, r_.oneOf(node["routing"], "activation_checkpoint.routing", routingRuleNames()));
      parseRoutingRule(rule, &ac.routing);
    }
    if (node["state_writes"]) {
      HPAC_ASSIGN_OR_RETURN(rule, r_.oneOf(node["state_writes"], "activation_checkpoint.state_writes",
                                           stateWriteRuleNames()));
      parseStateWriteRule(rule, &ac.state_writes);
    }
    if (node["memory_budget"]) {
      const YAML::Node b = node["memory_budget"];
      std::string text;
      HPAC_ASSIGN_OR_RETURN(text, r_.scalar(b, "activation_checkpoint.memory_budget"));
      absl::StatusOr<MemoryBudget> budget = parseMemoryBudget(text);
      if (!budget.ok()) return r_.error(b, "activation_checkpoint.memory_budget", std::string(budget.status().message()));
      ac.memory_budget = *std::move(budget);
      ac.memory_budget->where = r_.where(b);
    }
    if (node["memory_target"]) {
      const YAML::Node t = node["memory_target"];
      std::string text;
      HPAC_ASSIGN_OR_RETURN(text, r_.scalar(t, "activation_checkpoint.memory_target"));
      absl::StatusOr<MemoryBudget> target = parseMemoryTarget(text);
      if (!target.ok()) return r_.error(t, "activation_checkpoint.memory_target", std::string(target.status().message()));
      ac.memory_target = *std::move(target);
      ac.memory_target->where = r_.where(t);
    }
    if (node["plan"]) {
      std::string text;
      HPAC_ASSIGN_OR_RETURN(text, r_.scalar(node["plan"], "activation_checkpoint.plan"));
      if (text.empty()) {
        return r_.error(node["plan"], "activation_checkpoint.plan",
                        "is empty; allowed: the path of a step plan file made by `python -m hpac plan`");
      }
      ac.plan = text;
      ac.plan_where = r_.where(node["plan"]);
    }
    if (node["cost"]) {
      HPAC_ASSIGN_OR_RETURN(ac.cost, r_.oneOf(node["cost"], "activation_checkpoint.cost", {"measured", "estimated"}));
    }
    if (node["layers"]) {
      if (auto s = parseLayers(node["layers"], model, ac); !s.ok()) return s;
    }
    if (auto s = parsePolicy(node, ac); !s.ok()) return s;
    if (auto s = checkMemoryTarget(node, ac); !s.ok()) return s;
    if (auto s = checkPlan(node, ac); !s.ok()) return s;
    // memory_budget (or memory_target, or a plan) and mode budget come together.
    if (ac.usesBudget() && !ac.memory_budget && !ac.memory_target && !ac.plan) {
      const bool top = ac.mode == CheckpointMode::kBudget;
      const YAML::Node at = top ? node["mode"] : node["layers"];
      return r_.error(at, top ? "activation_checkpoint.mode" : "activation_checkpoint.layers",
                      absl::StrCat("'budget' needs activation_checkpoint.memory_budget (", kMemoryBudgetAllowed,
                                   ") or activation_checkpoint.memory_target (", kMemoryTargetAllowed, ")"));
    }
    if (ac.memory_budget && !ac.usesBudget()) {
      return r_.error(node["memory_budget"], "activation_checkpoint.memory_budget",
                      absl::StrCat("'", ac.memory_budget->text, "' is set but no layer uses mode budget (mode is '",
                                   toString(ac.mode), "'); allowed only with activation_checkpoint.mode: budget or a "
                                   "budget entry in activation_checkpoint.layers"));
    }
    if (node["cost"] && !ac.usesBudget()) {
      return r_.error(node["cost"], "activation_checkpoint.cost",
                      absl::StrCat("'", ac.cost, "' is set but no layer uses mode budget (mode is '", toString(ac.mode),
                                   "'); allowed only with activation_checkpoint.mode: budget or a budget entry in "
                                   "activation_checkpoint.layers"));
    }
    return absl::OkStatus();
  }

  // activation_checkpoint.plan: a whole step's plan made elsewhere (`python -m hpac plan`), with the top-level mode
  // budget only, instead of memory_budget and memory_target, without a per-layer plan (the file has one).
  absl::Status checkPlan(const YAML::Node& node, const ActivationCheckpointSpec& ac) {
    if (!ac.plan) return absl::OkStatus();
    const YAML::Node p = node["plan"];
    const std::string beside = ac.memory_budget ? "memory_budget" : ac.memory_target ? "memory_target" : "";
    if (!beside.empty()) {
      return r_.error(p, "activation_checkpoint.plan",
                      absl::StrCat("'", *ac.plan, "' is set beside ", beside, "; allowed: one of plan (a plan made "
                                   "by `python -m hpac plan`), memory_target and memory_budget"));
    }
    if (ac.mode != CheckpointMode::kBudget) {
      return r_.error(p, "activation_checkpoint.plan",
                      absl::StrCat("'", *ac.plan, "' is set but mode is '", toString(ac.mode),
                                   "'; allowed only with activation_checkpoint.mode: budget"));
    }
    if (!ac.layers.empty()) {
      return r_.error(p, "activation_checkpoint.plan",
                      absl::StrCat("'", *ac.plan, "' plans every layer; allowed only without "
                                   "activation_checkpoint.layers (", ac.layers.front().where, ")"));
    }
    return absl::OkStatus();
  }

  // activation_checkpoint.memory_target: the whole step's target, with the top-level mode budget only, instead of
  // memory_budget, without a per-layer plan (the target plans every layer).
  absl::Status checkMemoryTarget(const YAML::Node& node, const ActivationCheckpointSpec& ac) {
    if (!ac.memory_target) return absl::OkStatus();
    const YAML::Node t = node["memory_target"];
    if (ac.memory_budget) {
      return r_.error(t, "activation_checkpoint.memory_target",
                      absl::StrCat("'", ac.memory_target->text, "' is set beside memory_budget '",
                                   ac.memory_budget->text, "' (", ac.memory_budget->where, "); allowed: one of the "
                                   "two (memory_budget: each layer's share; memory_target: the whole step's bytes)"));
    }
    if (ac.mode != CheckpointMode::kBudget) {
      return r_.error(t, "activation_checkpoint.memory_target",
                      absl::StrCat("'", ac.memory_target->text, "' is set but mode is '", toString(ac.mode),
                                   "'; allowed only with activation_checkpoint.mode: budget"));
    }
    if (!ac.layers.empty()) {
      return r_.error(t, "activation_checkpoint.memory_target",
                      absl::StrCat("'", ac.memory_target->text, "' plans every layer; allowed only without "
                                   "activation_checkpoint.layers (", ac.layers.front().where, ")"));
    }
    return absl::OkStatus();
  }

  // activation_checkpoint.policy and .policy_params: the kind and its parameters are checked by the code that
  // makes the policy (policy/policy_kind.h), here, so that a bad pattern or shape is reported at its line.
  absl::Status parsePolicy(const YAML::Node& node, ActivationCheckpointSpec& ac) {
    if (node["policy"]) {
      HPAC_ASSIGN_OR_RETURN(ac.policy, r_.oneOf(node["policy"], "activation_checkpoint.policy", selectivePolicyKinds()));
    }
    if (node["policy_params"]) {
      HPAC_ASSIGN_OR_RETURN(ac.policy_params, r_.stringList(node["policy_params"], "activation_checkpoint.policy_params"));
    }
    const YAML::Node at = node["policy_params"] ? node["policy_params"] : node["policy"];
    const std::string key = node["policy_params"] ? "activation_checkpoint.policy_params" : "activation_checkpoint.policy";
    if ((node["policy"] || node["policy_params"]) && !ac.usesSelective()) {
      return r_.error(at, key, absl::StrCat("is set but no layer uses mode selective (mode is '", toString(ac.mode),
                                            "'); allowed only with activation_checkpoint.mode: selective or a selective "
                                            "entry in activation_checkpoint.layers"));
    }
    try {
      policyForKind(parsePolicyKind(ac.policy, "hpac"), ac.policy_params, "hpac");
    } catch (const c10::Error& e) {
      return r_.error(at, key, e.msg());
    }
    return absl::OkStatus();
  }

  absl::Status parseLayers(const YAML::Node& layers, const ModelSpec& model, ActivationCheckpointSpec& ac) {
    if (!layers.IsMap()) {
      return r_.error(layers, "activation_checkpoint.layers",
                      "expected a map of layer index or \"a-b\" range to off | full | selective | budget");
    }
    for (auto it = layers.begin(); it != layers.end(); ++it) {
      const YAML::Node key = it->first;
      const YAML::Node value = it->second;
      LayerRange range;
      range.where = r_.where(key);
      if (auto s = parseRange(key, model.num_layers, range); !s.ok()) return s;
      HPAC_ASSIGN_OR_RETURN(range.mode, mode(value, absl::StrCat("activation_checkpoint.layers.", key.Scalar())));
      for (const LayerRange& other : ac.layers) {
        if (range.first <= other.last && other.first <= range.last) {
          return r_.error(key, "activation_checkpoint.layers",
                          absl::StrCat("'", key.Scalar(), "' overlaps the entry at ", other.where, " (layers ",
                                       other.first, "-", other.last, "); each layer may appear once"));
        }
      }
      ac.layers.push_back(range);
    }
    std::sort(ac.layers.begin(), ac.layers.end(),
              [](const LayerRange& a, const LayerRange& b) { return a.first < b.first; });
    return absl::OkStatus();
  }

  absl::Status parseRange(const YAML::Node& key, int64_t num_layers, LayerRange& range) {
    const std::string allowed =
        absl::StrCat("allowed: a layer index or an inclusive range \"a-b\" with 0 <= a <= b <= ", num_layers - 1,
                     " (model.num_layers = ", num_layers, ")");
    if (!key.IsScalar()) return r_.error(key, "activation_checkpoint.layers", "expected an index or range; " + allowed);
    const std::string& text = key.Scalar();
    auto number = [](const std::string& s, int64_t& out) {
      if (s.empty() || s.size() > 9 || s.find_first_not_of("0123456789") != std::string::npos) return false;
      out = std::stoll(s);
      return true;
    };
    const size_t dash = text.find('-');
    bool ok = dash == std::string::npos ? number(text, range.first)
                                        : number(text.substr(0, dash), range.first) &&
                                              number(text.substr(dash + 1), range.last);
    if (dash == std::string::npos) range.last = range.first;
    if (!ok || range.first > range.last) {
      return r_.error(key, "activation_checkpoint.layers", absl::StrCat("'", text, "' is not valid; ", allowed));
    }
    if (range.last >= num_layers) {
      return r_.error(key, "activation_checkpoint.layers", absl::StrCat("'", text, "' is out of range; ", allowed));
    }
    return absl::OkStatus();
  }

  YamlReader r_;
};

}  // namespace

std::vector<std::string> modelPresetNames() {
  std::vector<std::string> names;
  for (const auto& [name, spec] : presets()) names.push_back(name);
  return names;
}

absl::StatusOr<ModelSpec> modelPreset(const std::string& name) {
  const auto all = presets();
  auto it = all.find(name);
  if (it == all.end()) {
    return absl::InvalidArgumentError(
        absl::StrCat("model preset '", name, "' is not known; allowed: ", joinNames(modelPresetNames())));
  }
  return it->second;
}

// Note [One size grammar] (policy/byte_size.h): a plain number is memory_budget's fraction, anything else a size.
absl::StatusOr<MemoryBudget> parseMemoryBudget(const std::string& text) {
  MemoryBudget b;
  b.text = text;
  const ByteSize size = parseByteSize(text);
  const bool plain = size.unit.empty() &&
                     (size.error == ByteSizeError::kPlainNumber || size.error == ByteSizeError::kNegative);
  if (plain) {
    if (!(size.number >= 0 && size.number <= 1)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "'", text, "' is outside [0, 1] (a plain number is a fraction; give bytes with a unit); ",
          kMemoryBudgetAllowed));
    }
    b.fraction = size.number;
    return b;
  }
  if (size.error == ByteSizeError::kNotASize) {
    return absl::InvalidArgumentError(absl::StrCat("'", text, "' is not a fraction or a size; ", kMemoryBudgetAllowed));
  }
  if (size.error != ByteSizeError::kOk) {
    return absl::InvalidArgumentError(absl::StrCat(byteSizeProblem(text, size), "; ", kMemoryBudgetAllowed));
  }
  b.bytes = size.bytes;
  return b;
}

absl::StatusOr<MemoryBudget> parseMemoryTarget(const std::string& text) {
  std::string error;
  const int64_t bytes = hpac::parseMemoryTarget(text, &error);
  if (bytes < 0) return absl::InvalidArgumentError(error);
  MemoryBudget b;
  b.text = text;
  b.bytes = bytes;
  return b;
}

bool ActivationCheckpointSpec::usesBudget() const {
  if (mode == CheckpointMode::kBudget) return true;
  return std::any_of(layers.begin(), layers.end(), [](const LayerRange& r) { return r.mode == CheckpointMode::kBudget; });
}

bool ActivationCheckpointSpec::usesSelective() const {
  if (mode == CheckpointMode::kSelective) return true;
  return std::any_of(layers.begin(), layers.end(),
                     [](const LayerRange& r) { return r.mode == CheckpointMode::kSelective; });
}

CheckpointMode ActivationCheckpointSpec::modeOf(int64_t index) const {
  for (const LayerRange& r : layers) {
    if (index >= r.first && index <= r.last) return r.mode;
  }
  return mode;
}

bool ActivationCheckpointSpec::allOff() const {
  if (mode != CheckpointMode::kOff) return false;
  return std::all_of(layers.begin(), layers.end(), [](const LayerRange& r) { return r.mode == CheckpointMode::kOff; });
}

const char* toString(ActivationSwap swap) { return swap == ActivationSwap::kAttention ? "attention" : "none"; }

std::string effectiveSummary(const TrainConfig& c) {
  const ModelSpec& m = c.model;
  std::string out = absl::StrCat(
      "model.preset=", m.preset, "\nmodel.num_layers=", m.num_layers, "\nmodel.hidden_size=", m.hidden_size,
      "\nmodel.num_attention_heads=", m.num_attention_heads, "\nmodel.num_key_value_heads=", m.num_key_value_heads,
      "\nmodel.head_dim=", m.head_dim, "\nmodel.intermediate_size=", m.intermediate_size,
      "\nmodel.moe_intermediate_size=", m.moe_intermediate_size, "\nmodel.num_experts=", m.num_experts,
      "\nmodel.num_experts_per_tok=", m.num_experts_per_tok, "\nmodel.vocab_size=", m.vocab_size,
      "\nmodel.num_kv_shared_layers=", m.num_kv_shared_layers, "\nmodel.norm_topk_prob=", m.norm_topk_prob,
      "\nmodel.rope_theta=", m.rope_theta, "\nmodel.rms_norm_eps=", m.rms_norm_eps);
  absl::StrAppend(&out, "\ntrain.seq_len=", c.train.seq_len, "\ntrain.micro_batch=", c.train.micro_batch,
                  "\ntrain.steps=", c.train.steps, "\ntrain.lr=", c.train.lr, "\ntrain.weight_decay=",
                  c.train.weight_decay, "\ntrain.seed=", c.train.seed, "\ntrain.dtype=", c.train.dtype,
                  "\ntrain.compile=", c.train.compile);
  absl::StrAppend(&out, "\nactivation_checkpoint.mode=", toString(c.activation_checkpoint.mode));
  if (const auto& b = c.activation_checkpoint.memory_budget) {
    absl::StrAppend(&out, "\nactivation_checkpoint.memory_budget=",
                    b->bytes >= 0 ? absl::StrCat(b->bytes, "B") : absl::StrCat(b->fraction));
    absl::StrAppend(&out, "\nactivation_checkpoint.cost=", c.activation_checkpoint.cost);
  }
  if (const auto& plan = c.activation_checkpoint.plan) {
    absl::StrAppend(&out, "\nactivation_checkpoint.plan=", *plan);
  }
  if (const auto& t = c.activation_checkpoint.memory_target) {
    absl::StrAppend(&out, "\nactivation_checkpoint.memory_target=", t->bytes, "B");
  }
  for (const LayerRange& r : c.activation_checkpoint.layers) {
    absl::StrAppend(&out, "\nactivation_checkpoint.layers.", r.first, "-", r.last, "=", toString(r.mode));
  }
  absl::StrAppend(&out, "\nactivation_checkpoint.routing=", toString(c.activation_checkpoint.routing),
                  "\nactivation_checkpoint.state_writes=", toString(c.activation_checkpoint.state_writes));
  if (c.activation_checkpoint.usesSelective()) {
    absl::StrAppend(&out, "\nactivation_checkpoint.policy=", c.activation_checkpoint.policy);
    for (const std::string& p : c.activation_checkpoint.policy_params) {
      absl::StrAppend(&out, "\nactivation_checkpoint.policy_params=", p);
    }
  }
  absl::StrAppend(&out, "\nactivation_swap=", toString(c.activation_swap), "\nparallel.tp=", c.parallel.tp,
                  "\nparallel.dp=", c.parallel.dp, "\nparallel.ep=", c.parallel.ep, "\nparallel.cp=", c.parallel.cp, "\nparallel.fsdp=",
                  c.parallel.fsdp);
  return out;
}

absl::StatusOr<TrainConfig> loadConfig(const std::string& path) {
  auto root = loadYamlFile(path);
  if (!root.ok()) return root.status();
  return ConfigParser(path).parse(*root);
}

absl::StatusOr<TrainConfig> parseConfig(const std::string& text, const std::string& file) {
  auto root = loadYamlString(text, file);
  if (!root.ok()) return root.status();
  return ConfigParser(file).parse(*root);
}

}  // namespace hpac::trainer
