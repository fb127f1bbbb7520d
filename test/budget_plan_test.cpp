// The budget planner (policy/budget_plan.h) on cases small enough to solve by hand.
#include "policy/budget_plan.h"

#include <gtest/gtest.h>

namespace hpac {
namespace {

ProfiledOp op(const std::string& name, int64_t occurrence, double micros,
              std::vector<std::pair<int64_t, int64_t>> storages) {
  ProfiledOp p;
  p.op = name;
  p.occurrence = occurrence;
  p.micros = micros;
  p.storages = std::move(storages);
  return p;
}

// An op with dataflow (Note [Dead ops are skipped]): reads, writes one storage of `bytes`, skippable.
ProfiledOp flow(const std::string& name, double micros, std::vector<int64_t> reads, int64_t writes, int64_t bytes) {
  ProfiledOp p = op(name, 0, micros, {{writes, bytes}});
  p.reads = std::move(reads);
  p.writes = {writes};
  p.skippable = true;
  return p;
}

// mm (10 µs) -> relu (1 µs) -> tanh (1 µs), 100 bytes each; autograd saves relu's and tanh's results (storages
// 2 and 3); storage 0 is the region's input.
std::vector<ProfiledOp> chain() {
  return {flow("aten::mm", 10, {0}, 1, 100), flow("aten::relu", 1, {1}, 2, 100), flow("aten::tanh", 1, {2}, 3, 100)};
}

// Note [Planning with the dataflow], by hand: within 200 bytes the additive knapsack keeps mm and one of the others
// (11 µs of kernels), leaving 1 µs to recompute; keeping relu and tanh instead leaves mm feeding nothing backward
// needs, so the recompute skips it and runs nothing. The planner must find the second.
TEST(BudgetPlan, KeepingWhatAutogradSavesLetsTheRecomputeSkipItsProducers) {
  const std::vector<int64_t> saved = {2, 3};
  const BudgetPlan additive = planBudget(chain(), 200);
  EXPECT_TRUE(additive.save[0]);
  EXPECT_DOUBLE_EQ(additive.saved_micros, 11.0);
  const BudgetPlan plan = planBudget(chain(), 200, &saved);
  EXPECT_EQ(plan.save, (std::vector<bool>{false, true, true}));
  EXPECT_EQ(plan.skip, (std::vector<bool>{true, false, false}));
  EXPECT_DOUBLE_EQ(plan.saved_micros, 2.0);
  EXPECT_DOUBLE_EQ(plan.skipped_micros, 10.0);
  EXPECT_EQ(plan.kept_bytes, 200);
}

// Note [The recompute's fixed cost], by hand: six ops in a chain, each 20 µs of host time around a kernel (mm 30 µs,
// the rest 1 µs), each saving its own 100-byte result for backward; 300 bytes to keep. A frame that recomputes to
// the end pays all six gaps whatever is kept, so the plan keeps mm and two others (120 + 3 µs). A frame that stops
// after the last tensor it does not hold makes keeping the tail worth its gaps: keeping mm and the last two stops
// the recompute after the fourth op (80 µs of gaps, 3 µs of kernels).
TEST(BudgetPlan, AFrameThatStopsEarlyMakesKeepingTheTailWorthItsHostTime) {
  std::vector<ProfiledOp> ops;
  std::vector<int64_t> saved;
  for (int64_t i = 0; i < 6; ++i) {
    ProfiledOp p = flow(i == 0 ? "aten::mm" : "aten::tanh", i == 0 ? 30 : 1, {i}, i + 1, 100);
    p.occurrence = i == 0 ? 0 : i - 1;
    p.gap_micros = 20;
    p.autograd_saves = {i + 1};
    saved.push_back(i + 1);
    ops.push_back(std::move(p));
  }
  const BudgetPlan to_the_end = planBudget(ops, 300, &saved, /*stops_early=*/false);
  EXPECT_TRUE(to_the_end.save[0]);
  EXPECT_EQ(to_the_end.kept_bytes, 300);
  EXPECT_DOUBLE_EQ(to_the_end.recompute_micros, 123.0);
  const BudgetPlan stopping = planBudget(ops, 300, &saved, /*stops_early=*/true);
  EXPECT_EQ(stopping.save, (std::vector<bool>{true, false, false, false, true, true}));
  EXPECT_DOUBLE_EQ(stopping.recompute_micros, 83.0);
  // Without positions (a profile from before they were recorded) the recompute reaches every op.
  for (ProfiledOp& p : ops) p.autograd_saves.clear();
  EXPECT_DOUBLE_EQ(planBudget(ops, 300, &saved, true).recompute_micros, 123.0);
}

// Note [An exact oracle for the planner]: the groups of a profile, and the plan of a choice made elsewhere with
// the fields planBudget fills. Keeping relu and tanh of the chain is the planner's own choice within 200 bytes;
// keeping mm alone leaves relu and tanh to recompute (2 µs) and nothing to skip, over any budget.
TEST(BudgetPlan, APlanKeepingChosenGroupsHasThePlannersFields) {
  const std::vector<int64_t> saved = {2, 3};
  std::vector<ProfiledOp> ops = chain();
  ops.push_back(op("aten::t", 0, 0, {{2, 100}}));  // a view of relu's result: in no group
  ops.back().view = true;
  const PlanGroups groups = planGroups(ops);
  EXPECT_EQ(groups.group_of, (std::vector<int64_t>{0, 1, 2, -1}));
  EXPECT_EQ(groups.bytes, (std::vector<int64_t>{100, 100, 100}));
  EXPECT_EQ(groups.micros, (std::vector<double>{10, 1, 1}));
  const BudgetPlan own = planBudget(ops, 200, &saved);
  const BudgetPlan same = planKeeping(ops, 200, {false, true, true}, &saved);
  EXPECT_EQ(same.save, own.save);
  EXPECT_EQ(same.skip, own.skip);
  EXPECT_EQ(same.kept_bytes, own.kept_bytes);
  EXPECT_DOUBLE_EQ(same.saved_micros, own.saved_micros);
  EXPECT_DOUBLE_EQ(same.skipped_micros, own.skipped_micros);
  const BudgetPlan mm = planKeeping(ops, 0, {true, false, false}, &saved);
  EXPECT_EQ(mm.save, (std::vector<bool>{true, false, false, false}));
  EXPECT_EQ(mm.skip, (std::vector<bool>{false, false, false, false}));
  EXPECT_EQ(mm.kept_bytes, 100);  // over its budget of 0: the choice is the caller's
  EXPECT_DOUBLE_EQ(mm.total_micros - mm.saved_micros - mm.skipped_micros, 2.0);
}

// Note [Collectives are kept by every plan]: by hand. The all-reduce is kept at every budget, even 0, and its
// bytes come off the budget first: with 150 bytes, 50 are left, which neither 100-byte op fits.
TEST(BudgetPlan, CollectivesAreKeptByEveryPlan) {
  std::vector<ProfiledOp> ops = {op("aten::mm", 0, 10, {{1, 100}}), op("_c10d_functional::all_reduce", 0, 1, {{2, 100}}),
                                 op("aten::relu", 0, 1, {{3, 100}})};
  ops[1].collective = true;
  for (int64_t budget : {0, 150}) {
    const BudgetPlan plan = planBudget(ops, budget);
    EXPECT_EQ(plan.save, (std::vector<bool>{false, true, false})) << budget;
    EXPECT_EQ(plan.kept_bytes, 100) << budget;
  }
  const std::vector<int64_t> saved = {3};
  EXPECT_EQ(planBudget(ops, 250, &saved).save, (std::vector<bool>{true, true, false}));  // 150 left: mm's 10 µs
}

// Note [Dead ops are skipped]: what keeps an op alive.
TEST(BudgetPlan, DeadOpsAreThoseNothingBackwardNeedsDependsOn) {
  const std::vector<int64_t> saved = {2, 3};
  const std::vector<bool> keep_relu_tanh = {false, true, true};
  EXPECT_EQ(deadOps(chain(), keep_relu_tanh, saved), (std::vector<bool>{true, false, false}));
  // Nothing kept: every op produces or feeds a saved tensor.
  EXPECT_EQ(deadOps(chain(), {false, false, false}, saved), (std::vector<bool>{false, false, false}));
  // Only tanh kept: relu's result is saved, so relu and mm run.
  EXPECT_EQ(deadOps(chain(), {false, false, true}, saved), (std::vector<bool>{false, false, false}));
  // An ignored op after relu reads mm's result (a copy_): mm runs.
  std::vector<ProfiledOp> copied = chain();
  copied[1].later_reads = {1};
  EXPECT_EQ(deadOps(copied, keep_relu_tanh, saved), (std::vector<bool>{false, false, false}));
  // mm is not skippable (an in-place write, a random op, a collective): it runs.
  std::vector<ProfiledOp> pinned = chain();
  pinned[0].skippable = false;
  EXPECT_EQ(deadOps(pinned, keep_relu_tanh, saved), (std::vector<bool>{false, false, false}));
  // A view of mm's result that nothing needed reads is not skipped (no kernel) and keeps nothing alive.
  std::vector<ProfiledOp> viewed = chain();
  ProfiledOp view = flow("aten::t", 0.1, {1}, 1, 100);
  view.view = true;
  view.skippable = false;
  viewed.insert(viewed.begin() + 1, view);
  EXPECT_EQ(deadOps(viewed, {false, false, true, true}, saved), (std::vector<bool>{true, false, false, false}));
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
