// Config parsing: defaults, the example file, and every rejection (file, line,
// column, bad value, allowed values).
#include "test/support/source_dir.h"
#include "tools/trainer/config.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace hpac::trainer {
namespace {

TrainConfig parseOk(const std::string& text) {
  auto c = parseConfig(text, "t.yaml");
  EXPECT_TRUE(c.ok()) << c.status().message();
  return c.ok() ? *c : TrainConfig{};
}

std::string parseError(const std::string& text) {
  auto c = parseConfig(text, "t.yaml");
  EXPECT_FALSE(c.ok()) << "accepted:\n" << text;
  return c.ok() ? "" : std::string(c.status().message());
}

TEST(TrainerConfig, EmptyAndAbsentSectionMeanOff) {
  EXPECT_EQ(parseOk("").activation_checkpoint.mode, CheckpointMode::kOff);
  const TrainConfig c = parseOk("train: {steps: 2}\n");
  EXPECT_EQ(c.activation_checkpoint.mode, CheckpointMode::kOff);
  EXPECT_TRUE(c.activation_checkpoint.allOff());
  EXPECT_EQ(c.activation_swap, ActivationSwap::kNone);
  EXPECT_EQ(c.train.steps, 2);
  EXPECT_EQ(c.model.preset, "qwen3_moe_tiny");
}

TEST(TrainerConfig, BareOffIsTheStringOff) {
  // YAML 1.1 readers turn a bare `off` into false; here it must mean mode off.
  EXPECT_EQ(parseOk("activation_checkpoint:\n  mode: off\n").activation_checkpoint.mode, CheckpointMode::kOff);
  EXPECT_EQ(parseOk("activation_checkpoint:\n  mode: \"off\"\n").activation_checkpoint.mode, CheckpointMode::kOff);
  EXPECT_EQ(parseOk("activation_checkpoint: {mode: full}\n").activation_checkpoint.mode, CheckpointMode::kFull);
  EXPECT_EQ(parseOk("activation_checkpoint: {mode: selective}\n").activation_checkpoint.mode, CheckpointMode::kSelective);
}

TEST(TrainerConfig, ExampleFileParses) {
  auto c = loadConfig(sourcePath("examples/training_demo/train.yaml"));
  ASSERT_TRUE(c.ok()) << c.status().message();
  EXPECT_EQ(c->model.preset, "qwen3_moe_tiny");
  EXPECT_EQ(c->activation_checkpoint.mode, CheckpointMode::kBudget);
  ASSERT_TRUE(c->activation_checkpoint.memory_budget.has_value());
  EXPECT_EQ(c->activation_checkpoint.memory_budget->text, "0.5");
}

TEST(TrainerConfig, MissingFileIsNamed) {
  auto c = loadConfig("/nonexistent/train.yaml");
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.status().message().find("/nonexistent/train.yaml"), std::string::npos);
}

TEST(TrainerConfig, BadModeNamesFileLineColumnValueAndAllowed) {
  const std::string e = parseError("train: {steps: 1}\nactivation_checkpoint:\n  mode: fast\n");
  EXPECT_NE(e.find("t.yaml:3:9"), std::string::npos) << e;
  EXPECT_NE(e.find("activation_checkpoint.mode"), std::string::npos) << e;
  EXPECT_NE(e.find("'fast'"), std::string::npos) << e;
  EXPECT_NE(e.find("allowed: off, full, selective"), std::string::npos) << e;
}

TEST(TrainerConfig, ModeRejectsOtherSpellingsAndTypes) {
  for (const char* v : {"false", "no", "0", "Off", "FULL", "''"}) {
    const std::string e = parseError(std::string("activation_checkpoint:\n  mode: ") + v + "\n");
    EXPECT_NE(e.find("allowed: off, full, selective"), std::string::npos) << v << ": " << e;
  }
  EXPECT_NE(parseError("activation_checkpoint:\n  mode: [full]\n").find("got a sequence"), std::string::npos);
  EXPECT_NE(parseError("activation_checkpoint:\n  mode: {a: 1}\n").find("got a map"), std::string::npos);
  EXPECT_NE(parseError("activation_checkpoint:\n  mode:\n").find("got a null"), std::string::npos);
  EXPECT_NE(parseError("activation_checkpoint: full\n").find("expected a map"), std::string::npos);
}

TEST(TrainerConfig, UnknownKeysAreRejectedWithPosition) {
  std::string e = parseError("activation_checkpoint:\n  mode: full\n  strategy: aggressive\n");
  EXPECT_NE(e.find("t.yaml:3:3"), std::string::npos) << e;
  EXPECT_NE(e.find("unknown key 'strategy'"), std::string::npos) << e;
  EXPECT_NE(e.find("allowed keys: mode, memory_budget, memory_target, plan, layers"), std::string::npos) << e;
  e = parseError("trian: {steps: 1}\n");
  EXPECT_NE(e.find("unknown key 'trian'"), std::string::npos) << e;
  e = parseError("model: {hidden: 64}\n");
  EXPECT_NE(e.find("unknown key 'hidden'"), std::string::npos) << e;
  e = parseError("train: {batch: 4}\n");
  EXPECT_NE(e.find("unknown key 'batch'"), std::string::npos) << e;
}

TEST(TrainerConfig, ActivationSwap) {
  EXPECT_EQ(parseOk("activation_swap: attention\n").activation_swap, ActivationSwap::kAttention);
  EXPECT_EQ(parseOk("activation_swap: none\n").activation_swap, ActivationSwap::kNone);
  const std::string e = parseError("activation_swap: mlp\n");
  EXPECT_NE(e.find("t.yaml:1:18"), std::string::npos) << e;
  EXPECT_NE(e.find("allowed: none, attention"), std::string::npos) << e;
}

TEST(TrainerConfig, LayerPlan) {
  const TrainConfig c = parseOk(
      "model: {num_layers: 6}\n"
      "activation_checkpoint:\n  mode: full\n  layers:\n    0: off\n    \"2-3\": selective\n    5: off\n");
  const auto& ac = c.activation_checkpoint;
  ASSERT_EQ(ac.layers.size(), 3u);
  EXPECT_EQ(ac.modeOf(0), CheckpointMode::kOff);
  EXPECT_EQ(ac.modeOf(1), CheckpointMode::kFull);
  EXPECT_EQ(ac.modeOf(2), CheckpointMode::kSelective);
  EXPECT_EQ(ac.modeOf(3), CheckpointMode::kSelective);
  EXPECT_EQ(ac.modeOf(4), CheckpointMode::kFull);
  EXPECT_EQ(ac.modeOf(5), CheckpointMode::kOff);
  // Global off with one layer on is not "all off".
  EXPECT_FALSE(parseOk("activation_checkpoint:\n  mode: off\n  layers: {1: full}\n").activation_checkpoint.allOff());
  // A bare 1-2 is the same plain scalar as "1-2".
  EXPECT_EQ(parseOk("activation_checkpoint:\n  layers: {1-2: full}\n").activation_checkpoint.modeOf(2), CheckpointMode::kFull);
}

TEST(TrainerConfig, LayerPlanRejections) {
  std::string e = parseError("model: {num_layers: 4}\nactivation_checkpoint:\n  layers:\n    \"0-2\": full\n    2: off\n");
  EXPECT_NE(e.find("t.yaml:5:5"), std::string::npos) << e;
  EXPECT_NE(e.find("overlaps the entry at t.yaml:4:5"), std::string::npos) << e;
  e = parseError("model: {num_layers: 4}\nactivation_checkpoint:\n  layers:\n    4: full\n");
  EXPECT_NE(e.find("'4' is out of range"), std::string::npos) << e;
  EXPECT_NE(e.find("0 <= a <= b <= 3"), std::string::npos) << e;
  e = parseError("model: {num_layers: 4}\nactivation_checkpoint:\n  layers:\n    \"1-7\": full\n");
  EXPECT_NE(e.find("'1-7' is out of range"), std::string::npos) << e;
  for (const char* key : {"\"3-1\"", "x", "\"-1\"", "\"1-\"", "\"1-2-3\"", "1.5"}) {
    e = parseError(std::string("activation_checkpoint:\n  layers:\n    ") + key + ": full\n");
    EXPECT_NE(e.find("is not valid"), std::string::npos) << key << ": " << e;
  }
  e = parseError("activation_checkpoint:\n  layers:\n    1: fast\n");
  EXPECT_NE(e.find("activation_checkpoint.layers.1: 'fast' is not allowed"), std::string::npos) << e;
  e = parseError("activation_checkpoint:\n  layers: [1, 2]\n");
  EXPECT_NE(e.find("expected a map"), std::string::npos) << e;
}

// Every document is rejected with a message holding "t.yaml:" and the expected part.
struct Rejection {
  const char* text;
  const char* expect;
};
void expectRejected(const std::vector<Rejection>& cases) {
  for (const Rejection& c : cases) {
    const std::string e = parseError(c.text);
    EXPECT_NE(e.find("t.yaml:"), std::string::npos) << c.text << ": " << e;
    EXPECT_NE(e.find(c.expect), std::string::npos) << c.text << ": " << e;
  }
}

TEST(TrainerConfig, TrainAndModelValuesAreChecked) {
  expectRejected({
      {"train: {steps: 0}\n", "'0' is out of range; allowed: integers in [1,"},
      {"train: {steps: ten}\n", "'ten' is not an integer"},
      {"train: {seq_len: 1.5}\n", "'1.5' is not an integer"},
      {"train: {lr: 0}\n", "train.lr: '0' is out of range; allowed: numbers > 0"},
      {"train: {lr: fast}\n", "'fast' is not a finite number"},
      {"train: {weight_decay: -0.1}\n", "allowed: numbers >= 0"},
      {"train: {dtype: fp16}\n", "allowed: float32, bfloat16"},
      {"train: {compile: yes}\n", "train.compile: 'yes' is not allowed; allowed: true, false"},
      {"activation_checkpoint: {mode: selective, routing: recompute}\n",
       "t.yaml:1:51: activation_checkpoint.routing: 'recompute' is not allowed; allowed: verify, save"},
      {"activation_checkpoint: {mode: full, state_writes: twice}\n",
       "activation_checkpoint.state_writes: 'twice' is not allowed; allowed: warn, error, skip"},
      {"train: {seed: -1}\n", "train.seed: '-1' is out of range"},
      {"model: {preset: llama}\n", "model.preset: 'llama' is not allowed; allowed: bi_encoder_tiny"},
      {"model: {num_attention_heads: 4, num_key_value_heads: 3}\n", "must divide num_attention_heads"},
      {"model: {num_experts: 4, num_experts_per_tok: 5}\n", "num_experts_per_tok: '5' is out of range"},
      {"model: {head_dim: 7}\n", "must be even"},
      {"model: {num_layers: 2, num_kv_shared_layers: 2}\n", "num_kv_shared_layers: '2' is out of range"},
      {"model: [1]\n", "model: expected a map, got a sequence"},
      {"key: [unclosed\n", "YAML syntax error"},
  });
}

TEST(TrainerConfig, PresetsAndOverrides) {
  const TrainConfig big = parseOk("model: {preset: qwen3_moe_30b_a3b, num_layers: 2}\n");
  EXPECT_EQ(big.model.hidden_size, 2048);
  EXPECT_EQ(big.model.num_attention_heads, 32);
  EXPECT_EQ(big.model.num_key_value_heads, 4);
  EXPECT_EQ(big.model.head_dim, 128);
  EXPECT_EQ(big.model.moe_intermediate_size, 768);
  EXPECT_EQ(big.model.num_experts, 128);
  EXPECT_EQ(big.model.num_experts_per_tok, 8);
  EXPECT_EQ(big.model.vocab_size, 151936);
  EXPECT_EQ(big.model.num_layers, 2);
  EXPECT_TRUE(big.model.norm_topk_prob);
  EXPECT_DOUBLE_EQ(big.model.rope_theta, 1e6);
  EXPECT_DOUBLE_EQ(big.model.rms_norm_eps, 1e-6);
  EXPECT_EQ(modelPresetNames().size(), 8u);
  EXPECT_FALSE(modelPreset("nope").ok());
}

TEST(TrainerConfig, ParallelDefaultsToOneRank) {
  const TrainConfig c = parseOk("train: {steps: 1}\n");
  EXPECT_EQ(c.parallel.worldSize(), 1);
  EXPECT_FALSE(c.parallel.distributed());
  const TrainConfig p = parseOk("parallel: {tp: 2, dp: 2, ep: 2, fsdp: true}\n");
  EXPECT_EQ(p.parallel.tp, 2);
  EXPECT_EQ(p.parallel.dp, 2);
  EXPECT_EQ(p.parallel.ep, 2);
  EXPECT_TRUE(p.parallel.fsdp);
  EXPECT_EQ(p.parallel.worldSize(), 4) << "expert parallelism borrows data-parallel ranks";
  EXPECT_EQ(p.parallel.where, "t.yaml:1:11");
}

TEST(TrainerConfig, ParallelExamplesParse) {
  for (const char* name : {"tp2", "ep2_dp2", "dp2_fsdp", "tp2_ep2_dp2_fsdp"}) {
    auto c = loadConfig(sourcePath("examples/distributed/" + std::string(name) + ".yaml"));
    ASSERT_TRUE(c.ok()) << name << ": " << c.status().message();
    EXPECT_TRUE(c->parallel.distributed()) << name;
  }
}

TEST(TrainerConfig, ParallelRejections) {
  // Degrees must divide what they split; each message names the key, value and the constraint.
  expectRejected({
      {"model: {num_attention_heads: 6, num_key_value_heads: 3}\nparallel: {tp: 2}\n",
       "t.yaml:2:16: parallel.tp: '2' must divide model.num_key_value_heads (3)"},
      {"parallel: {tp: 3}\n", "parallel.tp: '3' must divide model.num_attention_heads (4)"},
      {"parallel: {tp: 2, moe: 1}\n", "moe"},
      {"model: {num_attention_heads: 4, num_key_value_heads: 4, moe_intermediate_size: 30}\nparallel: {tp: 4}\n",
       "model.moe_intermediate_size (30)"},
      {"parallel: {ep: 2}\n", "t.yaml:1:16: parallel.ep: '2' must divide parallel.dp (1)"},
      {"parallel: {ep: 2}\n", "carved out of the data-parallel ranks"},
      {"model: {num_experts: 6, num_experts_per_tok: 2}\nparallel: {dp: 4, ep: 4}\n",
       "parallel.ep: '4' must divide model.num_experts (6)"},
      {"parallel: {tp: 2, fsdp: true}\n",
       "parallel.fsdp: true shards parameters over the data-parallel ranks, but parallel.dp is 1"},
      {"parallel: {tp: 0}\n", "parallel.tp"},
      {"parallel: {dp: 16, tp: 8}\n", "128 ranks; allowed: at most 64"},
      {"model: {preset: gpt2_tiny}\nparallel: {dp: 2}\n", "is implemented for the Qwen3-MoE presets"},
      {"model: {preset: gpt2_tiny}\nparallel: {dp: 2}\n", "'gpt2_tiny'"},
      {"train: {dtype: bfloat16}\nparallel: {dp: 2}\n", "needs train.dtype: float32"},
      {"parallel: {fsdp: maybe}\n", "parallel.fsdp"},
      {"train: {seq_len: 66}\nparallel: {cp: 2}\n",
       "t.yaml:2:16: parallel.cp: '2' with train.seq_len 66: context parallel splits each sequence into 2 x cp = 4 "
       "chunks"},
      {"parallel: {cp: 0}\n", "parallel.cp"},
      {"parallel: {dp: 8, cp: 16}\n", "tp x cp x dp = 128 ranks; allowed: at most 64"},
  });
}

TEST(TrainerConfig, ContextParallelCountsInTheWorldSize) {
  const TrainConfig c = parseOk("train: {seq_len: 64}\nparallel: {cp: 2, dp: 2, fsdp: true}\n");
  EXPECT_EQ(c.parallel.cp, 2);
  EXPECT_EQ(c.parallel.worldSize(), 4);
  EXPECT_NE(effectiveSummary(c).find("parallel.cp=2"), std::string::npos) << effectiveSummary(c);
}

// activation_checkpoint.policy / .policy_params: the kind and its parameters, checked by the code that makes the
// policy (policy/policy_kind.h), reported at their line.
TEST(TrainerConfig, SelectivePolicyKindsAndTheirParameters) {
  TrainConfig c = parseOk("activation_checkpoint: {mode: selective}\n");
  EXPECT_EQ(c.activation_checkpoint.policy, "selective");
  c = parseOk("activation_checkpoint: {mode: selective, policy: torchtitan, policy_params: [\"64x8\"]}\n");
  EXPECT_EQ(c.activation_checkpoint.policy, "torchtitan");
  EXPECT_EQ(c.activation_checkpoint.policy_params, std::vector<std::string>{"64x8"});
  EXPECT_NE(effectiveSummary(c).find("activation_checkpoint.policy=torchtitan"), std::string::npos);
  parseOk("activation_checkpoint: {mode: full, layers: {\"0\": selective}, policy: save_occurrences,\n"
          "                        policy_params: [\"aten::mm@::2\", \"aten::bmm@0,3:5\"]}\n");
  parseOk("activation_checkpoint: {mode: selective, policy: save_all_but, policy_params: [aten::mul.Tensor]}\n");

  std::string e = parseError("activation_checkpoint:\n  mode: selective\n  policy: titan\n");
  EXPECT_NE(e.find("t.yaml:3:11: activation_checkpoint.policy: 'titan'"), std::string::npos) << e;
  EXPECT_NE(e.find("selective, torchtitan, save_all_but, save_occurrences, save_list"), std::string::npos) << e;
  e = parseError("activation_checkpoint:\n  mode: selective\n  policy: torchtitan\n  policy_params: [\"64\"]\n");
  EXPECT_NE(e.find("t.yaml:4:18: activation_checkpoint.policy_params: hpac: shape '64' is not allowed; allowed: "
                   "'INxOUT'"), std::string::npos) << e;
  e = parseError("activation_checkpoint:\n  mode: selective\n  policy: save_occurrences\n"
                 "  policy_params: [\"aten::mm@1,x\"]\n");
  EXPECT_NE(e.find("t.yaml:4:18: activation_checkpoint.policy_params: hpac: occurrence pattern 'aten::mm@1,x': 'x' "
                   "is not allowed; allowed: 'ns::op[.overload]@ITEMS'"), std::string::npos) << e;
  e = parseError("activation_checkpoint:\n  mode: selective\n  policy_params: [aten::mm]\n");
  EXPECT_NE(e.find("policy kind 'selective' takes no parameters"), std::string::npos) << e;
  e = parseError("activation_checkpoint:\n  mode: full\n  policy: torchtitan\n");
  EXPECT_NE(e.find("t.yaml:3:11: activation_checkpoint.policy: is set but no layer uses mode selective"),
            std::string::npos) << e;
}

TEST(TrainerConfig, EffectiveSummaryNamesEverySettingRanksMustShare) {
  const TrainConfig a = parseOk("activation_checkpoint: {mode: full, layers: {\"1-2\": selective}}\nparallel: {dp: 2}\n");
  TrainConfig b = a;
  const std::string sa = effectiveSummary(a);
  EXPECT_NE(sa.find("activation_checkpoint.mode=full"), std::string::npos) << sa;
  EXPECT_NE(sa.find("activation_checkpoint.layers.1-2=selective"), std::string::npos) << sa;
  EXPECT_NE(sa.find("parallel.dp=2"), std::string::npos) << sa;
  b.activation_checkpoint.mode = CheckpointMode::kSelective;
  EXPECT_NE(effectiveSummary(b), sa);
  b = a;
  b.activation_checkpoint.layers[0].mode = CheckpointMode::kFull;
  EXPECT_NE(effectiveSummary(b), sa) << "a different plan must be a different config";
  b = a;
  b.train.seed = 7;
  EXPECT_NE(effectiveSummary(b), sa);
}

}  // namespace
}  // namespace hpac::trainer
