// The budget planner (policy/budget_plan.h) on cases small enough to solve by hand.
#include "policy/budget_plan.h"

#include <gtest/gtest.h>

namespace hpac {
namespace {

ProfiledOp op(const std::string& name, int64_t occurrence, double micros,
              std::vector<std::pair<int64_t, int64_t>> storages) {
  return ProfiledOp{name, nullptr, occurrence, micros, std::move(storages), false};
}

// A greedy choice by time per byte takes A (the best ratio) and then has no
// room for B or C; the optimum is B + C.
TEST(BudgetPlan, KnapsackBeatsTheGreedyRatio) {
  const std::vector<ProfiledOp> ops = {
      op("aten::mm", 0, 6.1, {{1, 60}}),  // 0.1017 us/B
      op("aten::mm", 1, 5.0, {{2, 50}}),  // 0.1 us/B
      op("aten::mm", 2, 5.0, {{3, 50}}),
  };
  const BudgetPlan plan = planBudget(ops, 100);
  EXPECT_EQ(plan.save, (std::vector<bool>{false, true, true}));
  EXPECT_EQ(plan.kept_bytes, 100);
  EXPECT_DOUBLE_EQ(plan.saved_micros, 10.0);
  EXPECT_EQ(plan.total_bytes, 160);
  EXPECT_DOUBLE_EQ(plan.total_micros, 16.1);
}

// An in-place op's result shares its input's storage: keeping both costs the
// storage's bytes once, and their times add up. Here {mm, relu_} (80 B, 9 us)
// beats relu (70 B, 8 us). (Views never form groups: ViewsAreNeverKept.)
TEST(BudgetPlan, AliasesShareTheirStorageCost) {
  const std::vector<ProfiledOp> ops = {
      op("aten::mm", 0, 5.0, {{7, 80}}),
      op("aten::relu_", 0, 4.0, {{7, 80}}),
      op("aten::relu", 0, 8.0, {{8, 70}}),
  };
  const BudgetPlan plan = planBudget(ops, 100);
  EXPECT_EQ(plan.save, (std::vector<bool>{true, true, false}));
  EXPECT_EQ(plan.kept_bytes, 80);
  EXPECT_EQ(plan.groups, 2);
  EXPECT_EQ(plan.total_bytes, 150);  // the shared storage counted once
}

// Note [Views are recomputed]: a view op is in no group and never kept, even
// when everything fits, and its bytes and time count nowhere.
TEST(BudgetPlan, ViewsAreNeverKept) {
  std::vector<ProfiledOp> ops = {
      op("aten::t", 0, 1.0, {{3, 4096}}),  // a view of a parameter the region did not produce
      op("aten::mm", 0, 5.0, {{7, 80}}),
      op("aten::unsqueeze", 0, 1.0, {{7, 80}}),
  };
  ops[0].view = ops[2].view = true;
  const BudgetPlan plan = planBudget(ops, 1 << 20);
  EXPECT_EQ(plan.save, (std::vector<bool>{false, true, false}));
  EXPECT_EQ(plan.total_bytes, 80);
  EXPECT_EQ(plan.kept_bytes, 80);
  EXPECT_EQ(plan.groups, 1);
  EXPECT_EQ(plan.total_micros, 5.0);
}

// topk's values and indices are two storages of one op: one group, both bytes.
TEST(BudgetPlan, AMultiOutputOpWeighsAllItsOutputs) {
  const std::vector<ProfiledOp> ops = {
      op("aten::topk", 0, 9.0, {{1, 40}, {2, 40}}),
      op("aten::silu", 0, 5.0, {{3, 60}}),
  };
  EXPECT_EQ(planBudget(ops, 79).save, (std::vector<bool>{false, true}));
  EXPECT_EQ(planBudget(ops, 80).save, (std::vector<bool>{true, false}));
}

TEST(BudgetPlan, EndpointsAreFullAndKeepEverything) {
  const std::vector<ProfiledOp> ops = {
      op("aten::mm", 0, 3.0, {{1, 64}}),
      op("aten::_local_scalar_dense", 0, 1.0, {}),  // no tensor output: free to keep
      op("aten::gelu", 0, 2.0, {{2, 32}}),
  };
  const BudgetPlan none = planBudget(ops, 0);
  EXPECT_EQ(none.save, (std::vector<bool>{false, true, false}));
  EXPECT_EQ(none.kept_bytes, 0);
  const BudgetPlan all = planBudget(ops, totalOutputBytes(ops));
  EXPECT_EQ(all.save, (std::vector<bool>{true, true, true}));
  EXPECT_EQ(all.kept_bytes, 96);
  EXPECT_EQ(planBudget(ops, -5).budget_bytes, 0);
}

// Against exhaustive search on every subset of 12 groups with awkward sizes: the
// plan fits the budget and is optimal for the budget minus the rounding slack
// the Note states (here budgets are small, so the unit is 1 byte and it is exact).
TEST(BudgetPlan, MatchesExhaustiveSearch) {
  std::vector<ProfiledOp> ops;
  for (int i = 0; i < 12; ++i) {
    ops.push_back(op("aten::op", i, 1.0 + (i * 37 % 11) * 0.7, {{i, 10 + (i * 53 % 29)}}));
  }
  for (int64_t budget : {0, 17, 45, 90, 150, 230}) {
    double best = 0;
    for (int mask = 0; mask < (1 << 12); ++mask) {
      int64_t bytes = 0;
      double value = 0;
      for (int i = 0; i < 12; ++i) {
        if (mask & (1 << i)) {
          bytes += ops[i].storages[0].second;
          value += ops[i].micros;
        }
      }
      if (bytes <= budget) best = std::max(best, value);
    }
    const BudgetPlan plan = planBudget(ops, budget);
    EXPECT_LE(plan.kept_bytes, budget);
    EXPECT_NEAR(plan.saved_micros, best, 1e-9) << "budget " << budget;
  }
}

}  // namespace
}  // namespace hpac
