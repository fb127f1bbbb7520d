// Budget mode in the trainer: activation_checkpoint.memory_budget parsing and
// every rejection (file:line:col, the value, what is allowed), routing (one
// BudgetRegion per layer), and bit-for-bit parity with the no-checkpoint run
// under every budget in {0, 0.25, 0.5, 0.75, 1} on the tiny Qwen3-MoE.
#include "test/support/parity.h"
#include "tools/trainer/config.h"
#include "tools/trainer/trainer.h"

#include <gtest/gtest.h>

#include <set>
#include <string>

namespace hpac::trainer {
namespace {

TrainConfig parseOk(const std::string& text) {
  auto c = parseConfig(text, "b.yaml");
  EXPECT_TRUE(c.ok()) << c.status().message();
  return c.ok() ? *c : TrainConfig{};
}

std::string parseError(const std::string& text) {
  auto c = parseConfig(text, "b.yaml");
  EXPECT_FALSE(c.ok()) << "accepted:\n" << text;
  return c.ok() ? "" : std::string(c.status().message());
}

std::string budgetYaml(const std::string& value) {
  return "activation_checkpoint:\n  mode: budget\n  memory_budget: " + value + "\n";
}

TEST(TrainerBudgetConfig, AFractionOrBytesWithAUnit) {
  const TrainConfig f = parseOk(budgetYaml("0.3"));
  EXPECT_EQ(f.activation_checkpoint.mode, CheckpointMode::kBudget);
  ASSERT_TRUE(f.activation_checkpoint.memory_budget.has_value());
  EXPECT_EQ(f.activation_checkpoint.memory_budget->fraction, 0.3);
  EXPECT_EQ(f.activation_checkpoint.memory_budget->bytes, -1);
  EXPECT_EQ(f.activation_checkpoint.memory_budget->where, "b.yaml:3:18");
  const std::pair<const char*, int64_t> sizes[] = {
      {"64MiB", int64_t{64} << 20}, {"512KiB", 512 * 1024}, {"2GiB", int64_t{2} << 30}, {"4096B", 4096},
      {"0B", 0}, {"1.5KiB", 1536}};
  for (const auto& [text, bytes] : sizes) {
    const TrainConfig c = parseOk(budgetYaml(text));
    ASSERT_TRUE(c.activation_checkpoint.memory_budget.has_value()) << text;
    EXPECT_EQ(c.activation_checkpoint.memory_budget->bytes, bytes) << text;
    EXPECT_EQ(c.activation_checkpoint.memory_budget->fraction, -1) << text;
  }
  for (const char* edge : {"0", "1", "0.0", "1.0"}) {
    EXPECT_TRUE(parseOk(budgetYaml(edge)).activation_checkpoint.memory_budget.has_value()) << edge;
  }
  // Per-layer budget entries take the section's memory_budget.
  const TrainConfig layers = parseOk(
      "activation_checkpoint:\n  mode: selective\n  memory_budget: 0.5\n  layers: {1: budget}\n");
  EXPECT_TRUE(layers.activation_checkpoint.usesBudget());
  EXPECT_EQ(layers.activation_checkpoint.modeOf(1), CheckpointMode::kBudget);
  EXPECT_NE(effectiveSummary(layers).find("activation_checkpoint.memory_budget=0.5"), std::string::npos);
}

// activation_checkpoint.cost (Note [Estimated op costs]): measured by default, estimated on request; either reaches
// the regions' spec; a value other than the two, or a cost without a budget layer, is refused with its position.
TEST(TrainerBudgetConfig, CostIsMeasuredOrEstimated) {
  EXPECT_EQ(parseOk(budgetYaml("0.3")).activation_checkpoint.cost, "measured");
  const TrainConfig e = parseOk(budgetYaml("0.3") + "  cost: estimated\n");
  EXPECT_EQ(e.activation_checkpoint.cost, "estimated");
  EXPECT_NE(effectiveSummary(e).find("activation_checkpoint.cost=estimated"), std::string::npos);
  EXPECT_EQ(budgetSpec(*e.activation_checkpoint.memory_budget, e.activation_checkpoint.cost).cost,
            BudgetCost::kEstimated);
  std::string err = parseError(budgetYaml("0.3") + "  cost: fast\n");
  EXPECT_NE(err.find("b.yaml:4:9: activation_checkpoint.cost: 'fast' is not allowed; allowed: measured, estimated"),
            std::string::npos)
      << err;
  err = parseError("activation_checkpoint:\n  mode: selective\n  cost: estimated\n");
  EXPECT_NE(err.find("activation_checkpoint.cost: 'estimated' is set but no layer uses mode budget"),
            std::string::npos)
      << err;
}

TEST(TrainerBudgetConfig, BadBudgetsNamePositionValueAndWhatIsAllowed) {
  const std::string allowed = "allowed: a fraction in [0, 1] of what the region keeps with checkpointing off (0.3), "
                              "or bytes per region with a unit: B, KiB, MiB, GiB or TiB (64MiB)";
  const std::pair<const char*, const char*> bad[] = {
      {"1.5", "'1.5' is outside [0, 1] (a plain number is a fraction; give bytes with a unit)"},
      {"-0.25", "'-0.25' is outside [0, 1]"},
      {"1000", "'1000' is outside [0, 1]"},
      {"-5MiB", "'-5MiB' is negative"},
      {"64MB", "'64MB' has unit 'MB'"},
      {"lots", "'lots' is not a fraction or a size"},
      {"nan", "'nan' is not a fraction or a size"},
      {".inf", "'.inf' is not a fraction or a size"}};
  for (const auto& [value, what] : bad) {
    const std::string e = parseError(budgetYaml(value));
    EXPECT_NE(e.find("b.yaml:3:18: activation_checkpoint.memory_budget: "), std::string::npos) << value << ": " << e;
    EXPECT_NE(e.find(what), std::string::npos) << value << ": " << e;
    EXPECT_NE(e.find(allowed), std::string::npos) << value << ": " << e;
  }
  EXPECT_NE(parseError(budgetYaml("[0.5]")).find("memory_budget: expected a"), std::string::npos);
}

TEST(TrainerBudgetConfig, BudgetAndMemoryBudgetComeTogether) {
  std::string e = parseError("activation_checkpoint:\n  mode: selective\n  memory_budget: 0.3\n");
  EXPECT_NE(e.find("b.yaml:3:18: activation_checkpoint.memory_budget: '0.3' is set but no layer uses mode budget "
                   "(mode is 'selective'); allowed only with activation_checkpoint.mode: budget"),
            std::string::npos)
      << e;
  e = parseError("activation_checkpoint:\n  mode: budget\n");
  EXPECT_NE(e.find("b.yaml:2:9: activation_checkpoint.mode: 'budget' needs activation_checkpoint.memory_budget "
                   "(allowed: a fraction in [0, 1]"),
            std::string::npos)
      << e;
  e = parseError("activation_checkpoint:\n  mode: full\n  layers: {0: budget}\n");
  EXPECT_NE(e.find("activation_checkpoint.layers: 'budget' needs activation_checkpoint.memory_budget"),
            std::string::npos)
      << e;
  e = parseError("activation_checkpoint:\n  memory_budget: 0.3\n");
  EXPECT_NE(e.find("is set but no layer uses mode budget (mode is 'off')"), std::string::npos) << e;
}

TEST(TrainerBudgetConfig, PlanIsAPathWithModeBudgetAloneAndHpacTrainRefusesIt) {
  const TrainConfig c = parseOk("activation_checkpoint:\n  mode: budget\n  plan: plans/p.json\n");
  ASSERT_TRUE(c.activation_checkpoint.plan.has_value());
  EXPECT_EQ(*c.activation_checkpoint.plan, "plans/p.json");
  EXPECT_EQ(c.activation_checkpoint.plan_where, "b.yaml:3:9");
  std::string e = parseError("activation_checkpoint:\n  mode: budget\n  plan: p.json\n  memory_budget: 0.5\n");
  EXPECT_NE(e.find("b.yaml:3:9: activation_checkpoint.plan: 'p.json' is set beside memory_budget; allowed: one of "
                   "plan"),
            std::string::npos)
      << e;
  e = parseError("activation_checkpoint:\n  mode: selective\n  plan: p.json\n");
  EXPECT_NE(e.find("'p.json' is set but mode is 'selective'; allowed only with activation_checkpoint.mode: budget"),
            std::string::npos)
      << e;
  e = parseError("activation_checkpoint:\n  mode: budget\n  plan: p.json\n  layers: {0: full}\n");
  EXPECT_NE(e.find("'p.json' plans every layer; allowed only without activation_checkpoint.layers"),
            std::string::npos)
      << e;
  e = parseError("activation_checkpoint:\n  mode: budget\n  plan: ''\n");
  EXPECT_NE(e.find("activation_checkpoint.plan: is empty; allowed: the path of a step plan file"), std::string::npos)
      << e;
  // A plan is for the transformers model hpac.hf.prepare wraps: hpac-train refuses it, naming the key.
  auto t = Trainer::create(c, *builtinRegistry(), nullptr);
  ASSERT_FALSE(t.ok());
  EXPECT_NE(std::string(t.status().message()).find("b.yaml:3:9: activation_checkpoint.plan 'plans/p.json': a step plan "
                                                   "from `python -m hpac plan`"),
            std::string::npos)
      << t.status().message();
}

TEST(TrainerBudgetConfig, MemoryTargetIsBytesWithModeBudgetAlone) {
  const TrainConfig c = parseOk("activation_checkpoint:\n  mode: budget\n  memory_target: 70GiB\n");
  ASSERT_TRUE(c.activation_checkpoint.memory_target.has_value());
  EXPECT_EQ(c.activation_checkpoint.memory_target->bytes, 70LL << 30);
  EXPECT_EQ(c.activation_checkpoint.memory_target->where, "b.yaml:3:18");
  const std::string allowed = "allowed: the most tensor bytes one rank may hold during a step, > 0, with a unit";
  const std::pair<const char*, const char*> bad[] = {
      {"0.5", "'0.5' is a plain number; the target is bytes with a unit"},
      {"0GiB", "'0GiB' is zero"},
      {"-1GiB", "'-1GiB' is negative"},
      {"70GB", "'70GB' has unit 'GB'"},
      {"lots", "'lots' is not a size"}};
  for (const auto& [value, what] : bad) {
    const std::string e = parseError(std::string("activation_checkpoint:\n  mode: budget\n  memory_target: ") + value);
    EXPECT_NE(e.find("b.yaml:3:18: activation_checkpoint.memory_target: "), std::string::npos) << value << ": " << e;
    EXPECT_NE(e.find(what), std::string::npos) << value << ": " << e;
    EXPECT_NE(e.find(allowed), std::string::npos) << value << ": " << e;
  }
  std::string e = parseError("activation_checkpoint:\n  mode: budget\n  memory_target: 8GiB\n  memory_budget: 0.5\n");
  EXPECT_NE(e.find("b.yaml:3:18: activation_checkpoint.memory_target: '8GiB' is set beside memory_budget '0.5' "
                   "(b.yaml:4:18); allowed: one of the two"),
            std::string::npos)
      << e;
  e = parseError("activation_checkpoint:\n  mode: selective\n  memory_target: 8GiB\n");
  EXPECT_NE(e.find("memory_target: '8GiB' is set but mode is 'selective'; allowed only with "
                   "activation_checkpoint.mode: budget"),
            std::string::npos)
      << e;
  e = parseError("activation_checkpoint:\n  mode: budget\n  memory_target: 8GiB\n  layers: {0: full}\n");
  EXPECT_NE(e.find("'8GiB' plans every layer; allowed only without activation_checkpoint.layers"), std::string::npos)
      << e;
  // hpac-train plans it on one rank: with parallel ranks or bfloat16, a refusal naming the key, before anything runs.
  const TrainConfig par = parseOk("parallel: {dp: 2}\nactivation_checkpoint:\n  mode: budget\n  memory_target: 70GiB\n");
  auto t = Trainer::create(par, *builtinRegistry(), nullptr);
  ASSERT_FALSE(t.ok());
  EXPECT_NE(std::string(t.status().message()).find("b.yaml:4:18: activation_checkpoint.memory_target '70GiB' with "
                                                   "parallel (b.yaml:1:11): hpac-train plans a whole-step target on "
                                                   "one rank"),
            std::string::npos)
      << t.status().message();
}

constexpr int kSteps = 3;

TrainConfig tinyConfig(const std::string& mode, const std::string& budget = "") {
  return parseOk(
      "model: {preset: qwen3_moe_tiny, num_layers: 2, hidden_size: 32, head_dim: 8, moe_intermediate_size: 32,\n"
      "        num_experts: 4, num_experts_per_tok: 2, vocab_size: 64}\n"
      "train: {seq_len: 48, micro_batch: 2, steps: 3, lr: 0.01}\n"
      "activation_checkpoint: {mode: " + mode + (budget.empty() ? "" : ", memory_budget: " + budget) + "}\n");
}

TEST(TrainerBudget, EachLayerHasItsOwnRegion) {
  auto t = Trainer::create(tinyConfig("budget", "0.5"), *builtinRegistry(), nullptr);
  ASSERT_TRUE(t.ok()) << t.status().message();
  const Preparation& prep = (*t)->preparation();
  ASSERT_EQ(prep.layers.size(), 2u);
  std::set<const BudgetRegion*> regions;
  for (const PreparedLayer& l : prep.layers) {
    EXPECT_EQ(l.setting.layer, CheckpointMode::kBudget);
    ASSERT_NE(l.setting.budget, nullptr);
    regions.insert(l.setting.budget.get());
  }
  EXPECT_EQ(regions.size(), 2u);
  EXPECT_EQ(prep.layers_wrapped, 2);
}

struct TrainRun {
  std::vector<StepResult> steps;
  std::vector<BudgetRegion::Status> regions;  // after the last step
};

TrainRun train(const TrainConfig& config) {
  auto t = Trainer::create(config, *builtinRegistry(), nullptr);
  EXPECT_TRUE(t.ok()) << t.status().message();
  TrainRun run;
  for (int s = 0; s < kSteps; ++s) run.steps.push_back((*t)->step(s, /*keep_grads=*/true));
  for (const PreparedLayer& l : (*t)->preparation().layers) {
    if (l.setting.budget) run.regions.push_back(l.setting.budget->status());
  }
  return run;
}

// Every step (the profile step and the replayed plans) matches off bit for bit:
// loss, input gradient and every parameter gradient.
TEST(TrainerBudget, EveryBudgetMatchesOffBitForBit) {
  const TrainRun off = train(tinyConfig("off"));
  for (const char* budget : {"0", "0.25", "0.5", "0.75", "1"}) {
    const TrainRun b = train(tinyConfig("budget", budget));
    for (int s = 0; s < kSteps; ++s) {
      EXPECT_TRUE(ScalarMatches(b.steps[s].loss, off.steps[s].loss)) << budget << " step " << s;
      ASSERT_TRUE(off.steps[s].grads[0].defined());
      EXPECT_TRUE(Matches(b.steps[s].grads, off.steps[s].grads)) << budget << " step " << s;
      EXPECT_EQ(b.steps[s].stats.invocations, 2) << budget << " step " << s;
    }
    ASSERT_EQ(b.regions.size(), 2u);
    for (const BudgetRegion::Status& st : b.regions) {
      EXPECT_EQ(st.stage, BudgetRegion::Stage::kPlanned) << budget;
      EXPECT_LE(st.plan.kept_bytes, st.plan.budget_bytes) << budget;
    }
    // The replayed steps serve what the plans keep: no bytes at 0 (outputs without bytes only); at 1 what off
    // keeps (Note [What off keeps]): less than every output, more than nothing.
    if (std::string(budget) == "0") {
      for (const BudgetRegion::Status& st : b.regions) EXPECT_EQ(st.plan.kept_bytes, 0);
    }
    if (std::string(budget) == "1") {
      for (const BudgetRegion::Status& st : b.regions) {
        EXPECT_EQ(st.plan.budget_bytes, st.plan.off_bytes);
        EXPECT_GT(st.plan.kept_bytes, 0);
        EXPECT_LT(st.plan.off_bytes, st.plan.total_bytes);
      }
      // Note [Frames hold what needs no recompute]: hpac's frame holds what off keeps; backward re-runs nothing.
      EXPECT_EQ(b.steps.back().stats.totals.served, 0);
      EXPECT_EQ(b.steps.back().stats.totals.recomputes, 0);
      EXPECT_GT(b.steps.back().stats.totals.held, 0);
    }
  }
}

// activation_checkpoint.memory_target in the Trainer (tools/trainer/memory_target.h) on the demo's tiny Qwen3-MoE
// shapes: a first run under a target no step reaches measures the model's floor and off's peak as the plan predicts
// them; the second, at a target between the two, keeps every step after the first planned one under it (a step
// over it warns and the next is replanned), checkpoints some layers, and trains bit for bit as off.
TrainConfig demoConfig(const std::string& target) {
  return parseOk(
      "model: {preset: qwen3_moe_tiny, num_layers: 4, hidden_size: 64, num_attention_heads: 4, num_key_value_heads: 2,\n"
      "        head_dim: 16, moe_intermediate_size: 64, num_experts: 8, num_experts_per_tok: 2, vocab_size: 512}\n"
      "train: {seq_len: 256, micro_batch: 4, steps: 6, lr: 1.0e-3, seed: 1234}\n"
      "activation_checkpoint: {mode: " + (target.empty() ? std::string("off") : "budget, memory_target: " + target) +
      "}\n");
}

TEST(TrainerMemoryTarget, HoldsTheTargetAndTrainsAsOff) {
  constexpr int kTargetSteps = 6;
  std::vector<StepResult> off;
  {
    auto t = Trainer::create(demoConfig(""), *builtinRegistry(), nullptr);
    ASSERT_TRUE(t.ok()) << t.status().message();
    for (int s = 0; s < kTargetSteps; ++s) off.push_back((*t)->step(s, /*keep_grads=*/true));
  }
  int64_t floor = 0, off_peak = 0;
  {
    auto t = Trainer::create(demoConfig("64GiB"), *builtinRegistry(), nullptr);
    ASSERT_TRUE(t.ok()) << t.status().message();
    for (int s = 0; s < 3; ++s) (*t)->step(s);
    ASSERT_NE((*t)->memoryTarget(), nullptr);
    const auto uniform = (*t)->memoryTarget()->target().uniformPlans();
    ASSERT_GE(uniform.size(), 2u);
    off_peak = uniform[0].first;  // every layer unwrapped
    floor = uniform[1].first;     // every layer at budget 0
    for (const LayerPlan& p : (*t)->memoryTarget()->target().layerPlans()) EXPECT_FALSE(p.checkpointed);
  }
  ASSERT_LT(floor, off_peak);
  const int64_t target = (floor + off_peak) / 2;
  auto t = Trainer::create(demoConfig(std::to_string(target) + "B"), *builtinRegistry(), nullptr);
  ASSERT_TRUE(t.ok()) << t.status().message();
  for (int s = 0; s < kTargetSteps; ++s) {
    const StepResult r = (*t)->step(s, /*keep_grads=*/true);  // compared and dropped: later steps hold no more bytes
    EXPECT_TRUE(ScalarMatches(r.loss, off[s].loss)) << "step " << s;
    EXPECT_TRUE(Matches(r.grads, off[s].grads)) << "step " << s;
  }
  const StepTarget& st = (*t)->memoryTarget()->target();
  const auto& history = st.history();
  ASSERT_EQ(history.size(), static_cast<size_t>(kTargetSteps));  // each step closes when its optimizer step ends
  int64_t checkpointed = 0;
  for (const LayerPlan& p : st.layerPlans()) checkpointed += p.checkpointed;
  EXPECT_GT(checkpointed, 0);
  for (const MeasuredStep& row : history) {  // every step: the profile step and the first planned one included
    EXPECT_LE(row.measured_bytes, target) << "step " << row.step;
  }
}

}  // namespace
}  // namespace hpac::trainer
