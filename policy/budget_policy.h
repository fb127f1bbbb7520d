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

// What the plan weighs each op's recompute by (Note [Estimated op costs],
// replay/op_cost.h): the measured kernel time (median over the profiles,
// synchronised on accelerators), or the estimate from its flops and bytes on
// the device's roofline (the same in every run).
enum class BudgetCost { kMeasured, kEstimated };
const char* toString(BudgetCost cost);
// "measured" | "estimated"; throws c10::Error naming the value and what is allowed.
BudgetCost parseBudgetCost(const std::string& text);

struct BudgetSpec {
  // Exactly one of the two: a fraction in [0, 1] of what the region keeps
  // with checkpointing off (Note [What off keeps] in policy/budget_plan.h; 0 is
  // `full`, 1 keeps as many bytes as off), or a number of bytes >= 0.
  double fraction = -1;
  int64_t bytes = -1;
  int64_t profile_invocations = 1;  // >= 1
  int64_t max_replans = 2;          // >= 0
  // Note [Dead ops are skipped] (policy/budget_plan.h). Off for code that
  // reads tensor values where hpac cannot see it (data_ptr, accessors, numpy,
  // tolist on CPU tensors) from an op's output inside the region: a skipped
  // op's outputs are uninitialised.
  bool skip_dead = true;
  BudgetCost cost = BudgetCost::kMeasured;
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

  // Plan files (Note [Plan files], policy/plan_file.h): a plan leaves the
  // process as text and comes back as a region that replays it from its first
  // call, without a profile; a forward that does not follow a loaded plan is an
  // error naming the plan and the first differing op.
  // planText() throws unless the region is planned.
  std::string planText() const;
  // `source` names the plan in messages (a file path). Throws c10::Error naming
  // the source, the line and what is allowed for text that is not a plan, and
  // for an op that is not registered in this process.
  static std::shared_ptr<BudgetRegion> fromPlanText(const std::string& text, const std::string& source);
  // Note [An exact oracle for the planner] (policy/budget_plan.h): the groups of the last complete profile, and
  // the text of the plan keeping the groups `keep` says at this region's budget (skip marks as its own plan
  // has them), for hpac.budget(plan=...) to replay. Both throw unless the region is planned from a profile.
  PlanGroups groups() const;
  std::string planTextKeeping(const std::vector<bool>& keep) const;
  // Note [The step's peak as events] (policy/step_plan.h): what this region would keep and cost under each of
  // `budgets` (bytes), planned from its last profile as its own plan is; and replan() makes the plan for a new
  // budget the one later invocations replay (the step planner's choice). candidates() throws unless the region is
  // planned from a profile; replan() keeps the budget for the region's next profile when it is profiling again (its
  // op sequence changed) and does nothing more in the fallback stage; it throws for a loaded plan.
  struct Candidate {
    int64_t budget_bytes = 0;
    int64_t kept_bytes = 0;
    // What the plan adds to its own backward: kept storages autograd does not save (held through it), and the
    // scratch buffer its skipped ops' returns lie over (Note [Skipped outputs share one buffer]).
    int64_t backward_bytes = 0;
    double recompute_micros = 0;  // predicted (BudgetPlan::recompute_micros, else the kernels run)
    // Note [A forward, op by op] (budget_policy.cpp): the bytes its forward holds at its highest moment, above
    // those alive when it began; -1: not measured.
    int64_t forward_bytes = -1;
  };
  std::vector<Candidate> candidates(const std::vector<int64_t>& budgets) const;
  // The same for the forward of the last profile as it ran (keeping nothing) and with the region unwrapped
  // (keeping what autograd saves); -1 where not measured or the region is not planned from a profile.
  struct ForwardBytes {
    int64_t profiled = -1;
    int64_t off = -1;
  };
  ForwardBytes forwardBytes() const;
  void replan(int64_t budget_bytes);
  // The source a region's plan was loaded from; "" for a profiled region.
  const std::string& planSource() const { return plan_source_; }

  // Internal to the policy objects of this region.
  // autograd_saved: storage ids the saved-tensor hook reported (Note [What off
  // keeps]); nullopt when no hook reported.
  // frame_holds: Policy::observeFrameHolds() was called (Note [The recompute's fixed cost]).
  void finishProfile(std::vector<ProfiledOp> profile, std::optional<std::vector<int64_t>> autograd_saved,
                     bool frame_holds, bool completed);
  void planDiverged();
  // What an invocation that starts now follows: the region's stage and, while it is planned, the plan by
  // (op, occurrence). The vectors are shared and never change; they are empty unless `stage` is kPlanned.
  struct Replay {
    Stage stage = Stage::kProfiling;
    std::shared_ptr<const std::vector<std::pair<const void*, int64_t>>> keys;  // (op, occurrence) in order
    std::shared_ptr<const std::vector<bool>> save;  // per key: keep its outputs
    std::shared_ptr<const std::vector<bool>> skip;  // per key: Note [Dead ops are skipped]; empty: none
    bool covers_off = false;  // the budget holds everything off keeps (Note [Frames hold what needs no recompute])
  };
  Replay replayPlan() const;

 private:
  // What the plans read of the profile's dataflow: the storage ids autograd saved, unless no hook reported them or
  // skip_dead is off (Note [What off keeps], Note [Dead ops are skipped]); caller holds mutex_.
  const std::vector<int64_t>* dataflow() const {
    return autograd_saved_ && spec_.skip_dead ? &*autograd_saved_ : nullptr;
  }
  // The plan for `budget` from profile_, as finishProfile makes it; caller holds mutex_.
  BudgetPlan planFor(int64_t budget) const;
  void checkProfiled(const char* what) const;

  const BudgetSpec spec_;
  mutable std::mutex mutex_;
  Stage stage_ = Stage::kProfiling;
  int64_t profiles_ = 0;
  int64_t replans_ = 0;
  std::vector<ProfiledOp> profile_;
  // Note [Plans from the median profile]: each profile forward's kernel times, per op of the profile.
  std::vector<std::vector<double>> profiled_micros_;
  BudgetPlan plan_;
  std::optional<std::vector<int64_t>> autograd_saved_;  // of the profile plan_ came from (Note [What off keeps])
  bool frame_holds_ = false;  // and its frame (Note [The recompute's fixed cost])
  std::shared_ptr<const std::vector<std::pair<const void*, int64_t>>> keys_;  // (op, occurrence) in order
  std::shared_ptr<const std::vector<bool>> save_;
  std::shared_ptr<const std::vector<bool>> skip_;  // Note [Dead ops are skipped]; empty: none
  std::string plan_source_;  // Note [Plan files]; set before the region is shared, constant after
  int64_t replanned_bytes_ = -1;  // the budget replan() set, kept by later profiles; -1: the spec's
};

const char* toString(BudgetRegion::Stage stage);

// Shorthand: a new region's factory.
PolicyFactory budgetPolicy(BudgetSpec spec);

}  // namespace hpac
