// Level0: off vs full vs selective on the tiny Qwen3-MoE over several AdamW
// steps. Loss, input gradient and every parameter gradient are compared bit for
// bit with the no-checkpoint run (fp32 CPU, same op order: the recompute runs
// the same kernels on the same values, and served outputs are the forward's own
// tensors). Per layer and step, the recompute counts are what the route and the
// policy predict, and peak bytes of full and selective are below off.
#include "test/support/parity.h"
#include "tools/trainer/qwen3_moe.h"
#include "tools/trainer/trainer.h"

#include <gtest/gtest.h>

namespace hpac::trainer {
namespace {

constexpr int kSteps = 3;
constexpr int kLayers = 2;

TrainConfig tinyConfig(const std::string& mode, bool compile = false) {
  auto c = parseConfig(
      "model: {preset: qwen3_moe_tiny, num_layers: 2, hidden_size: 32, head_dim: 8, moe_intermediate_size: 32,\n"
      "        num_experts: 4, num_experts_per_tok: 2, vocab_size: 64}\n"
      "train: {seq_len: 48, micro_batch: 2, steps: 3, lr: 0.01}\n"
      "activation_checkpoint: {mode: " + mode + "}\n",
      "level0.yaml");
  EXPECT_TRUE(c.ok()) << c.status().message();
  c->train.compile = compile;
  return *c;
}

struct TrainRun {
  std::vector<StepResult> steps;
  std::vector<std::vector<int64_t>> experts_hit;  // [step][layer]
};

TrainRun train(const TrainConfig& config) {
  auto t = Trainer::create(config, *builtinRegistry(), nullptr);
  EXPECT_TRUE(t.ok()) << t.status().message();
  TrainRun run;
  auto& model = dynamic_cast<Qwen3MoeForCausalLM&>((*t)->model());
  for (int s = 0; s < kSteps; ++s) {
    run.steps.push_back((*t)->step(s, /*keep_grads=*/true));
    std::vector<int64_t> hit;
    for (int l = 0; l < kLayers; ++l) {
      hit.push_back(model.model->layers[l]->as<Qwen3MoeDecoderLayerImpl>()->mlp->lastExpertsHit());
    }
    run.experts_hit.push_back(hit);
  }
  return run;
}

void expectBitwiseEqual(const TrainRun& off, const TrainRun& other, const std::string& what) {
  for (int s = 0; s < kSteps; ++s) {
    EXPECT_TRUE(ScalarMatches(off.steps[s].loss, other.steps[s].loss)) << what << " step " << s;
    const auto& a = off.steps[s].grads;
    ASSERT_TRUE(a[0].defined()) << "input gradient missing";
    EXPECT_TRUE(Matches(a, other.steps[s].grads)) << what << " step " << s;
  }
}

class Level0 : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    off_ = new TrainRun(train(tinyConfig("off")));
    full_ = new TrainRun(train(tinyConfig("full")));
    selective_ = new TrainRun(train(tinyConfig("selective")));
  }
  static void TearDownTestSuite() {
    delete off_;
    delete full_;
    delete selective_;
  }
  static TrainRun* off_;
  static TrainRun* full_;
  static TrainRun* selective_;
};
TrainRun* Level0::off_ = nullptr;
TrainRun* Level0::full_ = nullptr;
TrainRun* Level0::selective_ = nullptr;

TEST_F(Level0, LossAndGradientsBitwiseEqual) {
  expectBitwiseEqual(*off_, *full_, "full");
  expectBitwiseEqual(*off_, *selective_, "selective");
  // The model learns (the comparison is over a changing model, not a fixed point).
  EXPECT_LT(off_->steps.back().loss, off_->steps.front().loss);
}

// Every step of a run invoked `per_step` checkpoint regions and recomputed in
// each (a route that silently checkpointed nothing would still match off).
void expectInvocations(const TrainRun& run, int64_t per_step, const std::string& what) {
  for (const StepResult& r : run.steps) {
    EXPECT_EQ(r.stats.invocations, per_step) << what << " step " << r.step;
    EXPECT_EQ(r.stats.totals.recomputes, per_step) << what << " step " << r.step;
    EXPECT_GT(r.stats.totals.recomputed, 0) << what << " step " << r.step;
  }
}

TEST_F(Level0, FullCompileRouteBitwiseEqual) {
  // compile on: full checkpoints attention and MLP submodules (non-reentrant).
  const TrainConfig c = tinyConfig("full", /*compile=*/true);
  const TrainRun run = train(c);
  expectBitwiseEqual(*off_, run, "full (compile route)");
  expectInvocations(run, 2 * kLayers, "full (compile route)");
}

// The submodule route proper: a model with a vision tower is never native, so
// full checkpoints the attention, MLP and norms of every layer of both towers.
TEST(Level0Routes, FullSubmoduleRouteBitwiseEqual) {
  auto config = [](const std::string& mode) {
    auto c = parseConfig("model: {preset: llava_tiny}\ntrain: {seq_len: 16, micro_batch: 2, steps: 3}\n"
                         "activation_checkpoint: {mode: " + mode + "}\n",
                         "llava.yaml");
    EXPECT_TRUE(c.ok()) << c.status().message();
    return *c;
  };
  auto run = [](const TrainConfig& c, int64_t* wrapped) {
    auto t = Trainer::create(c, *builtinRegistry(), nullptr);
    EXPECT_TRUE(t.ok()) << t.status().message();
    TrainRun out;
    if (!t.ok()) return out;
    if (wrapped != nullptr) {
      EXPECT_EQ((*t)->preparation().full_route, FullRoute::kSubmodules);
      *wrapped = (*t)->preparation().submodules_wrapped;
    }
    for (int s = 0; s < kSteps; ++s) out.steps.push_back((*t)->step(s, /*keep_grads=*/true));
    return out;
  };
  int64_t wrapped = 0;
  const TrainRun off = run(config("off"), nullptr);
  const TrainRun full = run(config("full"), &wrapped);
  EXPECT_GT(wrapped, 0);
  expectBitwiseEqual(off, full, "full (submodule route)");
  expectInvocations(full, wrapped, "full (submodule route)");
}

// activation_checkpoint.policy: the field policies (policy/field_policies.h) as mode selective runs them, bitwise
// equal to off, each keeping something else than the built-in rules.
TEST_F(Level0, FieldPoliciesBitwiseEqual) {
  for (const std::string policy :
       {"selective, policy: torchtitan", "selective, policy: torchtitan, policy_params: [\"32x4\"]",
        "selective, policy: save_all_but, policy_params: [aten::silu, aten::mul]",
        "selective, policy: save_occurrences, policy_params: [\"aten::mm@1::2\", \"aten::bmm@0\"]"}) {
    const TrainRun run = train(tinyConfig(policy));
    expectBitwiseEqual(*off_, run, policy);
    const InvocationStats& got = run.steps[0].stats.totals;
    const InvocationStats& builtin = selective_->steps[0].stats.totals;
    EXPECT_TRUE(got.saved != builtin.saved || got.saved_bytes != builtin.saved_bytes) << policy;
    EXPECT_GT(run.steps[0].stats.totals.saved, 0) << policy;
  }
}

TEST_F(Level0, OffRunsNoInvocation) {
  for (const StepResult& r : off_->steps) {
    EXPECT_EQ(r.stats.invocations, 0);
    EXPECT_TRUE(r.layer_stats.empty());
  }
}

TEST_F(Level0, FullRecomputesEveryOpOfEveryLayerOnce) {
  for (int s = 0; s < kSteps; ++s) {
    const StepResult& r = full_->steps[s];
    ASSERT_EQ(r.layer_stats.size(), static_cast<size_t>(kLayers));
    for (int i = 0; i < kLayers; ++i) {
      const LayerStats& l = r.layer_stats[i];
      EXPECT_EQ(l.invocations, 1);
      EXPECT_EQ(l.totals.recomputes, 1);
      EXPECT_GT(l.totals.ops_forward, 50);
      // The native (reentrant) path runs its forward under no-grad, where
      // aten::matmul may take a different decomposition; its recompute runs
      // under grad mode and sees exactly the ops of the layer's ordinary
      // forward (the selective run's forward phase, same data).
      EXPECT_LE(l.totals.ops_forward, l.totals.ops_recompute);
      EXPECT_EQ(l.totals.ops_recompute, selective_->steps[s].layer_stats[i].totals.ops_forward);
      EXPECT_EQ(l.totals.recomputed, l.totals.ops_recompute);
      EXPECT_EQ(l.totals.saved, 0);
      EXPECT_EQ(l.totals.served, 0);
    }
  }
}

TEST_F(Level0, SelectiveSavesWhatThePolicySays) {
  for (int s = 0; s < kSteps; ++s) {
    const StepResult& r = selective_->steps[s];
    ASSERT_EQ(r.layer_stats.size(), static_cast<size_t>(kLayers));
    for (int l = 0; l < kLayers; ++l) {
      const LayerStats& ls = r.layer_stats[l];
      // mm per layer: q, k, v, o, router gate, and gate/up/down per expert hit;
      // the 1st, 3rd, ... are saved. In the save set besides: attention's two
      // bmm. The router (tools/moe/moe_router.cpp) counts tokens per expert with
      // aten::bincount, on every torch: no one_hot, whose range check is an
      // aten::max (in the save set) on torch 1.13.
      const int64_t hit = selective_->experts_hit[s][l];
      const int64_t mm = 5 + 3 * hit;
      const int64_t expected_saved = (mm + 1) / 2 + 2;
      EXPECT_EQ(ls.invocations, 1);
      EXPECT_EQ(ls.totals.recomputes, 1);
      EXPECT_EQ(ls.totals.saved, expected_saved) << "step " << s << " layer " << l << " experts hit " << hit;
      // Note [The recompute stops early]: the recompute ends at the layer's last saved tensor, so a kept output
      // after it is released unserved and the ops after it do not run again.
      EXPECT_EQ(ls.totals.served + ls.totals.unserved, expected_saved);
      EXPECT_LE(ls.totals.ops_recompute, ls.totals.ops_forward);
      EXPECT_EQ(ls.totals.recomputed, ls.totals.ops_recompute - ls.totals.served);
      EXPECT_GT(ls.totals.saved_bytes, 0);
    }
  }
}

TEST_F(Level0, PeakBytesOfFullAndSelectiveBelowOff) {
  for (int s = 0; s < kSteps; ++s) {
    const int64_t off = off_->steps[s].peak_bytes;
    EXPECT_LT(full_->steps[s].peak_bytes, off) << "step " << s;
    EXPECT_LT(selective_->steps[s].peak_bytes, off) << "step " << s;
    EXPECT_LT(full_->steps[s].peak_bytes, selective_->steps[s].peak_bytes) << "step " << s;
  }
}

}  // namespace
}  // namespace hpac::trainer
