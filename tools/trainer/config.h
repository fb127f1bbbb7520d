// hpac/tools/trainer/config.h
//
// TrainConfig: the trainer's YAML configuration (examples/training_demo/train.yaml),
// parsed strictly. Every section is optional and has defaults; absent
// `activation_checkpoint` means mode off. Unknown keys, wrong types and bad
// values are rejected with file, line, column, the bad value and the allowed
// values (see yaml_reader.h).
//
//   model:                       # the model zoo preset and its sizes
//     preset: qwen3_moe_tiny     # see modelPresetNames()
//     num_layers: 4              # any size key overrides the preset's value
//   train:
//     seq_len: 64
//     micro_batch: 2
//     steps: 6
//     lr: 1.0e-3
//     weight_decay: 0.0
//     seed: 1234
//     dtype: float32             # float32 | bfloat16
//     compile: false             # routing only: libtorch has no compiler
//   activation_checkpoint:
//     mode: selective            # off | full | selective | budget   (`off` is the string off)
//     memory_budget: 0.3         # with budget only: a fraction in [0, 1] of what each
//                                # region keeps under off, or bytes per region with a
//                                # unit: 64MiB, 512KiB, 2GiB, 4096B (a plain number is
//                                # always a fraction)
//     memory_target: 70GiB       # with budget only, instead of memory_budget: the most
//                                # live tensor bytes one rank may hold at any moment of
//                                # a step (parameters, gradients, optimizer state and
//                                # activations); every layer is planned to fit it
//                                # (policy/step_target.h: hpac.hf, and hpac-train on
//                                # one rank)
//     plan: plan.json            # with budget only, instead of the two above: a whole
//                                # step's plan made by `python -m hpac plan` (hpac.hf
//                                # applies it; path relative to this file's folder)
//     cost: measured             # with budget only: measured | estimated, what the plan
//                                # weighs a recompute by (Note [Estimated op costs])
//     layers:                    # optional per-layer plan over the language tower
//       0: off
//       "2-3": full              # inclusive range
//     routing: verify            # verify | save: MoE routing ops in the recompute
//                                # (replay/recompute_rules.h)
//     state_writes: warn         # warn | error | skip: recompute writes to buffers
//   activation_swap: none        # none | attention
//   parallel:                    # multi-rank layout (Qwen3-MoE presets; docs/distributed.md)
//     tp: 2                      # tensor parallel: heads and expert width split over tp ranks
//     dp: 2                      # data parallel; world size = tp x dp
//     ep: 2                      # expert parallel, carved out of dp: ep divides dp
//     fsdp: true                 # attention projections sharded over the dp ranks
#pragma once

#include "replay/checkpoint_mode.h"

#include "absl/status/statusor.h"

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace hpac::trainer {

// ModelSpec: which zoo model and its sizes. Keys follow the Hugging Face config names.
struct ModelSpec {
  std::string preset = "qwen3_moe_tiny";
  int64_t num_layers = 4;
  int64_t hidden_size = 64;
  int64_t num_attention_heads = 4;
  int64_t num_key_value_heads = 2;
  int64_t head_dim = 16;
  int64_t intermediate_size = 128;      // dense MLPs (GPT-2-like, vision tower, ...)
  int64_t moe_intermediate_size = 32;   // each expert of the Qwen3-MoE block
  int64_t num_experts = 8;
  int64_t num_experts_per_tok = 2;
  int64_t vocab_size = 256;
  int64_t num_kv_shared_layers = 0;     // KV-sharing zoo model only
  bool norm_topk_prob = true;
  double rope_theta = 1.0e6;
  double rms_norm_eps = 1.0e-6;
};

// The presets: qwen3_moe_tiny (CPU size), qwen3_moe_30b_a3b (the real
// Qwen3-30B-A3B layer shapes; set num_layers to use fewer than 48), and one
// tiny preset per other zoo model (gpt2_tiny, pipeline_stage_tiny, llava_tiny,
// gemma3n_kv_tiny, bi_encoder_tiny, custom_blocks_tiny).
std::vector<std::string> modelPresetNames();
// The spec of a preset (InvalidArgument naming the allowed presets otherwise).
absl::StatusOr<ModelSpec> modelPreset(const std::string& name);

struct TrainSpec {
  int64_t seq_len = 64;
  int64_t micro_batch = 2;
  int64_t steps = 6;
  double lr = 1.0e-3;
  double weight_decay = 0.0;
  int64_t seed = 1234;
  std::string dtype = "float32";  // float32 | bfloat16
  bool compile = false;
};

// One entry of activation_checkpoint.layers: layers [first, last] use `mode`.
struct LayerRange {
  int64_t first = 0;
  int64_t last = 0;
  CheckpointMode mode = CheckpointMode::kOff;
  std::string where;  // "file:line:col" of the key, for later errors
};

// activation_checkpoint.memory_budget: exactly one of the two is >= 0.
struct MemoryBudget {
  double fraction = -1;  // of what a region keeps with checkpointing off, in [0, 1]
  int64_t bytes = -1;    // per region
  std::string text;      // as written ("0.3", "64MiB")
  std::string where;     // "file:line:col"
};

struct ActivationCheckpointSpec {
  CheckpointMode mode = CheckpointMode::kOff;
  std::vector<LayerRange> layers;  // sorted by first, non-overlapping
  // Set exactly when some layer's mode is budget (the parser checks both ways).
  std::optional<MemoryBudget> memory_budget;
  // With mode budget, instead of memory_budget: the whole step's byte target (bytes only, > 0; no layers plan).
  std::optional<MemoryBudget> memory_target;
  // With mode budget, instead of memory_budget / memory_target: a step plan file made by `python -m hpac plan`
  // (plugin/python/hpac/_plan.py), its path as written (hpac.hf.prepare reads it, relative to the YAML's folder).
  std::optional<std::string> plan;
  std::string plan_where;  // "file:line:col"
  // With budget only: "measured" (profiled kernel times) or "estimated" (flops and bytes on the device's roofline).
  std::string cost = "measured";
  // What the recompute does about routing ops and writes to outside tensors (replay/recompute_rules.h).
  RoutingRule routing = RoutingRule::kVerify;
  StateWriteRule state_writes = StateWriteRule::kWarn;
  // What mode selective runs (policy/policy_kind.h): "selective" (the built-in rules, default), "torchtitan",
  // "save_all_but", "save_occurrences" or "save_list", with that kind's parameters (checked by the parser).
  std::string policy = "selective";
  std::vector<std::string> policy_params;
  // True when `mode` or a plan entry is budget.
  bool usesBudget() const;
  // True when `mode` or a plan entry is selective.
  bool usesSelective() const;
  // The mode of language-tower layer `index` (the plan entry covering it, else `mode`).
  CheckpointMode modeOf(int64_t index) const;
  // True when no layer can be checkpointed (mode off and every plan entry off).
  bool allOff() const;
};

// How the model is split over ranks. The world size is tp x dp. Expert
// parallelism does not add ranks: as in torchtitan, it borrows data-parallel
// ones — each group of `ep` consecutive dp ranks splits the experts between
// its members and exchanges tokens all-to-all (so ep divides dp).
struct ParallelSpec {
  int64_t tp = 1;
  int64_t dp = 1;
  int64_t ep = 1;
  int64_t cp = 1;  // context parallel: the torchrun runner only (torch's context_parallel, CUDA)
  bool fsdp = false;
  std::string where;  // "file:line:col" of the section, for later errors
  int64_t worldSize() const { return tp * cp * dp; }
  bool distributed() const { return worldSize() > 1; }
};

enum class ActivationSwap { kNone, kAttention };
const char* toString(ActivationSwap swap);

struct TrainConfig {
  std::string file = "<defaults>";
  ModelSpec model;
  TrainSpec train;
  ActivationCheckpointSpec activation_checkpoint;
  ActivationSwap activation_swap = ActivationSwap::kNone;
  ParallelSpec parallel;
};

// The effective settings, one "key=value" line each (every model, train,
// activation_checkpoint, activation_swap and parallel field, plan entries
// included): what the ranks of a parallel job must agree on.
std::string effectiveSummary(const TrainConfig& config);

// Reads and validates a config file / text (`file` names it in errors).
absl::StatusOr<TrainConfig> loadConfig(const std::string& path);
absl::StatusOr<TrainConfig> parseConfig(const std::string& text, const std::string& file = "<string>");

// Parses a memory_budget value (the grammar above): InvalidArgument "'<text>' ..." naming what is allowed.
absl::StatusOr<MemoryBudget> parseMemoryBudget(const std::string& text);
// Parses a memory_target value: bytes with a unit, > 0.
absl::StatusOr<MemoryBudget> parseMemoryTarget(const std::string& text);

}  // namespace hpac::trainer
