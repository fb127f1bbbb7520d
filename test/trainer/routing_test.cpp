// Routing: off has no side effects; selective wraps every layer whole; full
// takes each branch of the decision tree; KV sharing; activation_swap; the
// per-layer plan; the checkpoint seam; state_dict round trip and resume.
#include "plugin/fallback.h"
#include "test/support/parity.h"
#include "replay/tracking_allocator.h"
#include "tools/trainer/qwen3_moe.h"
#include "tools/trainer/routing.h"
#include "tools/trainer/trainer.h"
#include "tools/trainer/zoo_models.h"

#include <gtest/gtest.h>
#include <torch/serialize.h>

#include <algorithm>
#include <set>
#include <sstream>

namespace hpac::trainer {
namespace {

const ModelRegistry& registry() { return *builtinRegistry(); }

TrainConfig config(const std::string& preset, const std::string& mode, const std::string& extra = "") {
  auto c = parseConfig("model: {preset: " + preset + "}\ntrain: {seq_len: 16, micro_batch: 2, steps: 2}\n" +
                           "activation_checkpoint:\n  mode: " + mode + "\n" + extra,
                       "test.yaml");
  EXPECT_TRUE(c.ok()) << c.status().message();
  return *c;
}

struct Prepared {
  std::shared_ptr<ZooModel> model;
  Preparation prep;
};

Prepared prepare(const TrainConfig& c, const std::function<void(ZooModel&)>& before = nullptr) {
  Prepared p;
  p.model = makeZooModel(c.model, 7);
  if (before) before(*p.model);
  auto prep = prepareModel(*p.model, c, registry(), nullptr);
  EXPECT_TRUE(prep.ok()) << prep.status().message();
  if (prep.ok()) p.prep = *prep;
  return p;
}

std::set<std::string> submodulesOf(const PreparedLayer& l) {
  std::set<std::string> out;
  for (const auto& [name, mode] : l.setting.submodules) out.insert(name);
  return out;
}

bool anyMessage(const Preparation& p, const std::string& needle) {
  for (const std::string& m : p.messages) {
    if (m.find(needle) != std::string::npos) return true;
  }
  return false;
}

TEST(TrainerRouting, OffHasNoSideEffects) {
  const TrainConfig c = config("qwen3_moe_tiny", "off", "  layers: {0: off}\nactivation_swap: attention\n");
  auto trainer = Trainer::create(c, registry(), nullptr);
  ASSERT_TRUE(trainer.ok()) << trainer.status().message();
  const Preparation& prep = (*trainer)->preparation();
  EXPECT_FALSE(prep.touched);
  EXPECT_TRUE(prep.layers.empty());
  EXPECT_TRUE(prep.use_cache_disabled.empty());
  EXPECT_TRUE((*trainer)->model().config().use_cache);
  EXPECT_EQ(prep.warnings.size(), 1u);  // activation_swap has no effect on CPU
  for (const auto& m : (*trainer)->model().modules()) {
    if (auto* l = dynamic_cast<CheckpointableLayer*>(m.get())) {
      EXPECT_FALSE(l->checkpointSetting().enabled());
    }
  }
  const uint64_t entries = fallbackEntriesOnThisThread();
  const InvocationStats before = globalStats();
  const StepResult r = (*trainer)->step(0);
  EXPECT_EQ(fallbackEntriesOnThisThread(), entries) << "the hpac fallback was entered with mode off";
  EXPECT_EQ(globalStats().ops_forward, before.ops_forward);
  EXPECT_EQ(r.stats.invocations, 0);
}

TEST(TrainerRouting, SelectiveWrapsEveryLayerWhole) {
  for (const char* preset : {"qwen3_moe_tiny", "llava_tiny", "custom_blocks_tiny", "gpt2_tiny", "bi_encoder_tiny"}) {
    const Prepared p = prepare(config(preset, "selective"));
    ASSERT_FALSE(p.prep.layers.empty()) << preset;
    for (const PreparedLayer& l : p.prep.layers) {
      EXPECT_EQ(l.setting.layer, CheckpointMode::kSelective) << preset << " " << l.layer.path;
      EXPECT_FALSE(l.setting.reentrant);
      EXPECT_TRUE(l.setting.submodules.empty());
      EXPECT_EQ(l.layer.checkpointable->checkpointSetting().layer, CheckpointMode::kSelective);
    }
    EXPECT_EQ(p.prep.layers_wrapped, static_cast<int64_t>(p.prep.layers.size())) << preset;
    EXPECT_EQ(p.prep.submodules_wrapped, 0);
    EXPECT_FALSE(p.prep.full_route.has_value());
  }
}

// Note [Nothing outlives its model]: a layer counts its calls in bounded space whether or not anyone takes the
// stats, a forward dropped without backward frees what the layers kept, and no invocation outlives its graph.
TEST(TrainerRouting, LayersHoldNothingAcrossCallsNobodyTakes) {
  TrackingAllocator& tracker = TrackingAllocator::install();
  for (const char* mode : {"selective", "full", "budget\n  memory_budget: 0.5"}) {
    auto trainer = Trainer::create(config("qwen3_moe_tiny", mode), registry(), nullptr);
    ASSERT_TRUE(trainer.ok()) << trainer.status().message();
    Trainer& t = **trainer;
    const TrainConfig& c = t.config();
    t.step(0);  // a budget profiles and plans
    const at::Tensor tokens = tokenBatch(c, 1);
    { at::Tensor warm = t.model().loss(tokens); }  // the model keeps its last input embeddings (for their grads)
    const int64_t baseline = tracker.currentBytes();
    constexpr int kCalls = 6;
    for (int i = 0; i < kCalls; ++i) {
      { at::Tensor dropped = t.model().loss(tokens); }  // evaluation in train mode: no backward
      EXPECT_EQ(tracker.currentBytes(), baseline) << mode << ": dropped forward " << i + 1;
      at::Tensor loss = t.model().loss(tokens);
      loss.backward();
    }
    EXPECT_EQ(Invocation::alive(), 0) << mode;
    int64_t counted = 0;
    for (const PreparedLayer& l : t.preparation().layers) {
      ASSERT_NE(l.layer.checkpointable, nullptr);
      EXPECT_LE(l.layer.checkpointable->pendingInvocations(), 1u) << mode << " " << l.layer.path;
      counted += l.layer.checkpointable->takeStats().invocations;
    }
    // step 0's calls were taken by step(); every later call (the warm forward, kCalls dropped, kCalls trained) once
    EXPECT_EQ(counted, (2 * kCalls + 1) * static_cast<int64_t>(t.preparation().layers.size())) << mode;
  }
}

TEST(TrainerRouting, FullNativePath) {
  for (const char* preset : {"qwen3_moe_tiny", "gpt2_tiny", "pipeline_stage_tiny", "bi_encoder_tiny"}) {
    const Prepared p = prepare(config(preset, "full"));
    ASSERT_TRUE(p.prep.full_route.has_value());
    EXPECT_EQ(*p.prep.full_route, FullRoute::kNative) << preset << ": " << p.prep.full_route_reason;
    for (const PreparedLayer& l : p.prep.layers) {
      EXPECT_EQ(l.setting.layer, CheckpointMode::kFull);
      EXPECT_TRUE(l.setting.reentrant);
    }
    EXPECT_TRUE(anyMessage(p.prep, "full: native path")) << preset;
  }
}

TEST(TrainerRouting, FullWithCompileWrapsAttentionAndMlpOnly) {
  TrainConfig c = config("qwen3_moe_tiny", "full");
  c.train.compile = true;
  const Prepared p = prepare(c);
  ASSERT_TRUE(p.prep.full_route.has_value());
  EXPECT_EQ(*p.prep.full_route, FullRoute::kCompile);
  for (const PreparedLayer& l : p.prep.layers) {
    EXPECT_EQ(submodulesOf(l), (std::set<std::string>{"self_attn", "mlp"})) << l.layer.path;
    EXPECT_EQ(l.setting.layer, CheckpointMode::kOff);
  }
  EXPECT_EQ(p.prep.submodules_wrapped, 8);
  // libtorch has no compiler: hpac-train says once that compile only chose the route.
  EXPECT_TRUE(anyMessage(p.prep, "train.compile: true chooses the routes only here"));
  c.train.compile = false;
  EXPECT_FALSE(anyMessage(prepare(c).prep, "train.compile"));
}

TEST(TrainerRouting, FullSubmodulesForTwoTowers) {
  const Prepared p = prepare(config("llava_tiny", "full"));
  ASSERT_TRUE(p.prep.full_route.has_value());
  EXPECT_EQ(*p.prep.full_route, FullRoute::kSubmodules);
  EXPECT_NE(p.prep.full_route_reason.find("vision tower"), std::string::npos) << p.prep.full_route_reason;
  int language = 0, vision = 0;
  for (const PreparedLayer& l : p.prep.layers) {
    if (l.role == Role::kLanguage) {
      ++language;
      EXPECT_EQ(submodulesOf(l),
                (std::set<std::string>{"mlp", "self_attn", "input_layernorm", "post_attention_layernorm"}));
    } else {
      ++vision;
      EXPECT_EQ(submodulesOf(l), (std::set<std::string>{"mlp", "self_attn", "layer_norm1", "layer_norm2"}));
    }
  }
  EXPECT_EQ(language, 2);
  EXPECT_EQ(vision, 2);
  EXPECT_EQ(p.prep.submodules_wrapped, 16);
  // Without KV sharing use_cache is switched off everywhere.
  EXPECT_EQ(p.prep.use_cache_disabled,
            (std::vector<std::string>{"config", "config.text_config", "config.vision_config"}));
  EXPECT_FALSE(p.model->config().use_cache);
  EXPECT_FALSE(p.model->config().sub_configs.at("text_config")->use_cache);
  EXPECT_FALSE(p.model->config().sub_configs.at("vision_config")->use_cache);
}

TEST(TrainerRouting, FullWithAFrozenLayerIsNotNative) {
  const Prepared p = prepare(config("qwen3_moe_tiny", "full"), [](ZooModel& m) {
    auto& q = dynamic_cast<Qwen3MoeForCausalLM&>(m);
    for (at::Tensor& t : q.model->layers[1]->parameters()) t.set_requires_grad(false);
  });
  ASSERT_TRUE(p.prep.full_route.has_value());
  EXPECT_EQ(*p.prep.full_route, FullRoute::kSubmodules);
  EXPECT_NE(p.prep.full_route_reason.find("frozen"), std::string::npos);
  EXPECT_EQ(submodulesOf(p.prep.layers[0]),
            (std::set<std::string>{"mlp", "self_attn", "input_layernorm", "post_attention_layernorm"}));
}

TEST(TrainerRouting, NamesOutsideTheAliasListsWrapNothingAndWarn) {
  const Prepared p = prepare(config("custom_blocks_tiny", "full"));
  ASSERT_TRUE(p.prep.full_route.has_value());
  EXPECT_EQ(*p.prep.full_route, FullRoute::kSubmodules);
  EXPECT_NE(p.prep.full_route_reason.find("does not declare checkpointing support"), std::string::npos);
  EXPECT_EQ(p.prep.layers_wrapped + p.prep.submodules_wrapped, 0);
  ASSERT_FALSE(p.prep.warnings.empty());
  EXPECT_NE(p.prep.warnings.back().find("0 modules wrapped"), std::string::npos) << p.prep.warnings.back();
}

// The decision order (Note [Full decision order] in route_plan.cpp), one test per branch beyond the ones above:
// a model that is not language-tower-only takes the submodule path even with compile on (it used to take the
// compile path and never wrap its norms); KV sharing comes before compile; compile comes before the native checks.
Prepared prepareFullWithCompile(const std::string& model) {
  TrainConfig c = config(model, "full");
  c.train.compile = true;
  return prepare(c);
}

TEST(TrainerRouting, FullTwoTowersWithCompileTakesSubmodulesFirst) {
  const Prepared p = prepareFullWithCompile("llava_tiny");
  ASSERT_TRUE(p.prep.full_route.has_value());
  EXPECT_EQ(*p.prep.full_route, FullRoute::kSubmodules) << p.prep.full_route_reason;
  EXPECT_NE(p.prep.full_route_reason.find("not language-tower-only"), std::string::npos) << p.prep.full_route_reason;
  for (const PreparedLayer& l : p.prep.layers) {
    const std::set<std::string> subs = submodulesOf(l);
    EXPECT_TRUE(subs.count("input_layernorm") || subs.count("layer_norm1")) << l.layer.path << ": norms not wrapped";
  }
  EXPECT_EQ(p.prep.submodules_wrapped, 16);
}

TEST(TrainerRouting, FullKvSharingWithCompileTakesSubmodulesWithoutAttention) {
  const Prepared p = prepareFullWithCompile("gemma3n_kv_tiny");
  ASSERT_TRUE(p.prep.full_route.has_value());
  EXPECT_EQ(*p.prep.full_route, FullRoute::kSubmodules) << p.prep.full_route_reason;
  EXPECT_NE(p.prep.full_route_reason.find("KV sharing"), std::string::npos) << p.prep.full_route_reason;
  for (const PreparedLayer& l : p.prep.layers) {
    EXPECT_EQ(submodulesOf(l), (std::set<std::string>{"mlp", "input_layernorm", "post_attention_layernorm"}));
  }
}

TEST(TrainerRouting, FullCompileIsCheckedBeforeTheNativeConditions) {
  TrainConfig c = config("custom_blocks_tiny", "full");  // not native: no checkpointing support declared
  c.train.compile = true;
  const Prepared p = prepare(c);
  ASSERT_TRUE(p.prep.full_route.has_value());
  EXPECT_EQ(*p.prep.full_route, FullRoute::kCompile) << p.prep.full_route_reason;
}

TEST(TrainerRouting, KvSharingKeepsCacheAndNeverCheckpointsAttention) {
  for (const char* mode : {"selective", "full"}) {
    const Prepared p = prepare(config("gemma3n_kv_tiny", mode));
    EXPECT_TRUE(p.prep.kv_sharing);
    EXPECT_TRUE(p.prep.use_cache_disabled.empty());
    EXPECT_TRUE(p.model->config().use_cache);
    EXPECT_TRUE(p.model->config().sub_configs.at("text_config")->use_cache);
    for (const PreparedLayer& l : p.prep.layers) {
      EXPECT_EQ(l.setting.layer, CheckpointMode::kOff) << mode;
      EXPECT_EQ(submodulesOf(l), (std::set<std::string>{"mlp", "input_layernorm", "post_attention_layernorm"}))
          << mode << " " << l.layer.path;
    }
    EXPECT_TRUE(anyMessage(p.prep, "use_cache kept, attention is never checkpointed"));
    if (std::string(mode) == "selective") {
      ASSERT_EQ(p.prep.warnings.size(), 1u);
      EXPECT_NE(p.prep.warnings[0].find("selective with KV sharing degrades to submodule checkpointing"),
                std::string::npos);
    } else {
      EXPECT_EQ(*p.prep.full_route, FullRoute::kSubmodules);
    }
  }
}

TEST(TrainerRouting, KvSharingTrainsAndMatchesOff) {
  std::vector<double> losses;
  for (const char* mode : {"off", "selective", "full"}) {
    auto t = Trainer::create(config("gemma3n_kv_tiny", mode), registry(), nullptr);
    ASSERT_TRUE(t.ok()) << t.status().message();
    const StepResult a = (*t)->step(0);
    const StepResult b = (*t)->step(1);
    if (std::string(mode) != "off") {
      EXPECT_GT(b.stats.invocations, 0) << mode;
    }
    losses.push_back(b.loss);
  }
  EXPECT_TRUE(ScalarMatches(losses[1], losses[0]));
  EXPECT_TRUE(ScalarMatches(losses[2], losses[0]));
}

TEST(TrainerRouting, KvSharingModelNeedsTheCache) {
  auto model = makeZooModel(*modelPreset("gemma3n_kv_tiny"), 1);
  model->config().sub_configs.at("text_config")->use_cache = false;
  try {
    model->loss(at::zeros({1, 8}, at::kLong));
    FAIL() << "expected an error";
  } catch (const c10::Error& e) {
    EXPECT_NE(std::string(e.what()).find("use_cache is false"), std::string::npos) << e.what();
  }
}

TEST(TrainerRouting, ActivationSwapConflictNamesBothSettings) {
  for (const char* mode : {"full", "selective"}) {
    auto model = makeZooModel(*modelPreset("qwen3_moe_tiny"), 1);
    auto prep = prepareModel(*model, config("qwen3_moe_tiny", mode, "activation_swap: attention\n"), registry(),
                             nullptr);
    ASSERT_FALSE(prep.ok());
    const std::string m(prep.status().message());
    EXPECT_NE(m.find(std::string("activation_checkpoint.mode: ") + mode), std::string::npos) << m;
    EXPECT_NE(m.find("activation_swap: attention"), std::string::npos) << m;
    EXPECT_NE(m.find("test.yaml"), std::string::npos) << m;
  }
  auto model = makeZooModel(*modelPreset("qwen3_moe_tiny"), 1);
  auto prep = prepareModel(*model, config("qwen3_moe_tiny", "off", "  layers: {1: full}\nactivation_swap: attention\n"),
                           registry(), nullptr);
  ASSERT_FALSE(prep.ok());
  EXPECT_NE(prep.status().message().find("activation_checkpoint.layers"), std::string::npos);
}

TEST(TrainerRouting, PerLayerPlan) {
  const Prepared p = prepare(
      config("qwen3_moe_tiny", "off", "  layers: {0: off, \"1-2\": selective, 3: full}\n"));
  ASSERT_EQ(p.prep.layers.size(), 4u);
  EXPECT_FALSE(p.prep.layers[0].setting.enabled());
  EXPECT_EQ(p.prep.layers[1].setting.layer, CheckpointMode::kSelective);
  EXPECT_EQ(p.prep.layers[2].setting.layer, CheckpointMode::kSelective);
  EXPECT_EQ(p.prep.layers[3].setting.layer, CheckpointMode::kFull);
  EXPECT_TRUE(p.prep.layers[3].setting.reentrant);
  EXPECT_EQ(p.prep.layers_wrapped, 3);

  // The pipeline stage holds layers 2 and 3 only.
  auto stage = makeZooModel(*modelPreset("pipeline_stage_tiny"), 1);
  auto bad = prepareModel(*stage, config("pipeline_stage_tiny", "full", "  layers: {0: selective}\n"), registry(),
                          nullptr);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("layer 0 is out of range; the language tower model.layers holds layers 2, 3"),
            std::string::npos)
      << bad.status().message();
}

// Every zoo model trains in every mode, and full and selective follow off's
// loss curve exactly.
TEST(TrainerRouting, EveryZooModelTrainsInEveryModeWithOffsLosses) {
  for (const std::string& preset : modelPresetNames()) {
    if (preset == "qwen3_moe_30b_a3b") continue;  // real shapes: gigabytes per layer
    std::vector<std::vector<double>> losses;
    for (const char* mode : {"off", "full", "selective"}) {
      auto t = Trainer::create(config(preset, mode), registry(), nullptr);
      ASSERT_TRUE(t.ok()) << preset << " " << mode << ": " << t.status().message();
      losses.push_back({(*t)->step(0).loss, (*t)->step(1).loss});
      EXPECT_TRUE(std::isfinite(losses.back()[1])) << preset << " " << mode;
    }
    EXPECT_TRUE(ScalarMatches(losses[1], losses[0])) << preset << " full";
    EXPECT_TRUE(ScalarMatches(losses[2], losses[0])) << preset << " selective";
  }
}

TEST(TrainerRouting, Bfloat16IsRefusedWhereMemoryIsTracked) {
  TrackingAllocator::install();
  TrainConfig c = config("qwen3_moe_tiny", "selective");
  c.train.dtype = "bfloat16";
  auto t = Trainer::create(c, registry(), nullptr);
  ASSERT_FALSE(t.ok());
  EXPECT_NE(t.status().message().find("train.dtype: bfloat16"), std::string::npos) << t.status().message();
  EXPECT_NE(t.status().message().find("raw_allocate"), std::string::npos);
}

TEST(TrainerSeam, SettingsAreValidated) {
  auto model = makeZooModel(*modelPreset("qwen3_moe_tiny"), 1);
  auto* layer = dynamic_cast<Qwen3MoeForCausalLM&>(*model).model->layers[0]->as<Qwen3MoeDecoderLayerImpl>();
  CheckpointSetting both;
  both.layer = CheckpointMode::kFull;
  both.submodules["mlp"] = CheckpointMode::kFull;
  EXPECT_THROW(layer->setCheckpoint(both), c10::Error);
  CheckpointSetting unknown;
  unknown.submodules["feed_forward"] = CheckpointMode::kFull;
  EXPECT_THROW(layer->setCheckpoint(unknown), c10::Error);
  CheckpointSetting reentrant_selective;
  reentrant_selective.layer = CheckpointMode::kSelective;
  reentrant_selective.reentrant = true;
  EXPECT_THROW(layer->setCheckpoint(reentrant_selective), c10::Error);
  EXPECT_FALSE(layer->checkpointSetting().enabled());
}

std::vector<std::string> parameterNames(torch::nn::Module& m) {
  std::vector<std::string> names;
  for (const auto& item : m.named_parameters()) names.push_back(item.key());
  return names;
}

// Wrapping must leave a model's parameters alone: the same tensors under the
// same (Hugging Face) names before and after preparation, so that state dicts
// and optimizer state keyed by name still apply. Checked on one model instance
// before and after, and against names written out by hand.
TEST(TrainerSeam, WrappingKeepsParameterNames) {
  const std::vector<std::string> some_hf_names = {
      "model.embed_tokens.weight",
      "model.layers.0.self_attn.q_proj.weight",
      "model.layers.0.self_attn.k_norm.weight",
      "model.layers.0.mlp.gate.weight",
      "model.layers.0.mlp.experts.0.down_proj.weight",
      "model.layers.1.post_attention_layernorm.weight",
      "model.norm.weight",
      "lm_head.weight"};
  for (bool compile : {false, true}) {
    for (const char* mode : {"full", "selective"}) {
      TrainConfig c = config("qwen3_moe_tiny", mode);
      c.train.compile = compile;
      std::vector<std::string> names_before;
      std::vector<at::Tensor> params_before;
      const Prepared wrapped = prepare(c, [&](ZooModel& m) {
        names_before = parameterNames(m);
        params_before = m.parameters();
      });
      EXPECT_TRUE(wrapped.prep.layers_wrapped + wrapped.prep.submodules_wrapped > 0);
      const std::vector<std::string> names_after = parameterNames(*wrapped.model);
      EXPECT_EQ(names_after, names_before) << mode << (compile ? " compile" : "");
      const std::vector<at::Tensor> params_after = wrapped.model->parameters();
      ASSERT_EQ(params_after.size(), params_before.size());
      for (size_t i = 0; i < params_after.size(); ++i) {
        EXPECT_TRUE(params_after[i].is_same(params_before[i])) << names_after[i];
      }
      for (const std::string& n : some_hf_names) {
        EXPECT_NE(std::find(names_after.begin(), names_after.end(), n), names_after.end()) << n;
      }
    }
  }
}

// Trains `first` for 2 steps, saves model and optimizer, loads both into a
// fresh trainer of `second` and trains 2 more: the losses continue those of an
// uninterrupted off run exactly.
TEST(TrainerSeam, StateDictRoundTripAndResume) {
  for (auto [first, second] : {std::pair<const char*, const char*>{"selective", "off"}, {"off", "full"},
                               {"full", "selective"}}) {
    auto reference = Trainer::create(config("qwen3_moe_tiny", "off"), registry(), nullptr);
    std::vector<double> expected;
    for (int s = 0; s < 4; ++s) expected.push_back((*reference)->step(s).loss);

    auto a = Trainer::create(config("qwen3_moe_tiny", first), registry(), nullptr);
    ASSERT_TRUE(a.ok());
    EXPECT_EQ((*a)->step(0).loss, expected[0]);
    EXPECT_EQ((*a)->step(1).loss, expected[1]);
    std::stringstream model_bytes, optimizer_bytes;
    torch::save((*a)->modelPtr(), model_bytes);
    torch::save((*a)->optimizer(), optimizer_bytes);

    // A fresh trainer of the other kind whose parameters start elsewhere
    // (another init seed): everything it continues with comes from the files.
    auto b = Trainer::create(config("qwen3_moe_tiny", second), registry(), nullptr);
    ASSERT_TRUE(b.ok());
    {
      at::NoGradGuard no_grad;
      for (at::Tensor& p : (*b)->model().parameters()) p.add_(1.0);
    }
    auto model = (*b)->modelPtr();
    torch::load(model, model_bytes);
    torch::load((*b)->optimizer(), optimizer_bytes);
    EXPECT_EQ((*b)->step(2).loss, expected[2]) << first << " -> " << second;
    EXPECT_EQ((*b)->step(3).loss, expected[3]) << first << " -> " << second;
  }
}

}  // namespace
}  // namespace hpac::trainer
