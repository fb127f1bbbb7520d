// hpac/policy/budget_policy.h
//
// The memory-budget policy: profile, plan, replay.
//   1. The first `profile_invocations` invocations of a region run as a
//      profile: everything is recomputed (as `full`), and every op's kernel
//      time and the storages keeping its outputs would hold are recorded
//      (Policy::observe).
//   2. From the last profile, planBudget() chooses the outputs to keep within
//      the budget at the least recompute time (Note [Budget as a knapsack]).
//   3. Every later invocation replays that plan by (op, occurrence).
// Note [Plans that stay valid]: a forward whose op sequence differs from the
// plan's (dynamic shapes, MoE routing that changes the ops per expert) uses
// the fixed selective policy from the first differing op on (decisions are
// recorded, so the recompute agrees), and the region profiles again; after
// `max_replans` such re-profiles it keeps the fixed selective policy for good,
// with one warning.
//
// One BudgetRegion per region shape: invocations of one region (one layer's
// checkpoint, step after step; or layers of identical structure) share it.
// Thread-safe: invocations on several threads may share a region.
#pragma once

#include "policy/budget_plan.h"
#include "policy/checkpoint_policy.h"

#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

namespace hpac {

struct BudgetSpec {
  // Exactly one of the two: a fraction in [0, 1] of the region's
  // keep-everything point (the bytes every counted op's outputs hold; 0 is
  // `full`, 1 keeps all), or a number of bytes >= 0.
  double fraction = -1;
  int64_t bytes = -1;
  int64_t profile_invocations = 1;  // >= 1
  int64_t max_replans = 2;          // >= 0
};

// Checks a spec; throws c10::Error naming the value and what is allowed.
void validateBudgetSpec(const BudgetSpec& spec);

// A checked spec from a front-end's arguments (Python, the YAML), where "not
// given" is an empty optional: a -1 given explicitly is rejected by name too.
BudgetSpec makeBudgetSpec(std::optional<double> fraction, std::optional<int64_t> bytes,
                          int64_t profile_invocations = 1, int64_t max_replans = 2);

class BudgetRegion : public std::enable_shared_from_this<BudgetRegion> {
 public:
  enum class Stage { kProfiling, kPlanned, kFallback };

  explicit BudgetRegion(BudgetSpec spec);  // validates

  // The factory for this region's checkpoint calls.
  PolicyFactory factory();

  struct Status {
    Stage stage;
    int64_t profiles = 0;  // profile forwards finished
    int64_t replans = 0;   // plans dropped because a forward's op sequence differed
    std::vector<ProfiledOp> profile;  // the last complete profile
    BudgetPlan plan;                  // valid in kPlanned
  };
  Status status() const;

  // Internal to the policy objects of this region.
  void finishProfile(std::vector<ProfiledOp> profile, bool completed);
  void planDiverged();
  bool planFor(std::shared_ptr<const std::vector<std::pair<const void*, int64_t>>>* keys,
               std::shared_ptr<const std::vector<bool>>* save, Stage* stage) const;

 private:
  const BudgetSpec spec_;
  mutable std::mutex mutex_;
  Stage stage_ = Stage::kProfiling;
  int64_t profiles_ = 0;
  int64_t replans_ = 0;
  std::vector<ProfiledOp> profile_;
  BudgetPlan plan_;
  std::shared_ptr<const std::vector<std::pair<const void*, int64_t>>> keys_;  // (op, occurrence) in order
  std::shared_ptr<const std::vector<bool>> save_;
};

const char* toString(BudgetRegion::Stage stage);

// Shorthand: a new region's factory.
PolicyFactory budgetPolicy(BudgetSpec spec);

}  // namespace hpac
