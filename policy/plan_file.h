// hpac/policy/plan_file.h
//
// Plan files: the text a budget plan leaves the process as, and reads back
// from (Note [Plan files]). BudgetRegion::planText() and planTextKeeping()
// write one, BudgetRegion::fromPlanText() makes a region of one
// (policy/budget_policy.h); this file holds the format and nothing of the
// region.
#pragma once

#include "policy/budget_plan.h"
#include "policy/profiled_op.h"

#include <string>
#include <vector>

namespace hpac {

// Note [Plan files]
// A plan leaves the process as text and comes back as a region that replays
// it from its first call, without a profile:
//   hpac-budget-plan 1
//   budget_bytes N, kept_bytes N, total_bytes N, off_bytes N, groups N,
//   kept_groups N, saved_micros X, total_micros X   (one "key value" per line)
//   ops N
//   keep|recompute|skip <occurrence> <ns::op> <overload, "-" for none> <µs> <bytes>   (N lines;
//   skip: recomputed in the forward's plan, skipped in the recompute, Note [Dead ops are skipped])
// Lines starting with '#' are comments. A plan is for the region it was
// made in, on the same shapes: a forward whose op sequence differs from a
// loaded plan is an error naming the plan and the first differing op (a
// loaded plan is never re-profiled silently), and a forward that ends
// before the plan does is warned about once and the region keeps the fixed
// selective policy (BudgetRegion, policy/budget_policy.cpp). A plan of
// another format version is refused by name: plans are not converted.

// A plan as its text gives it back: per op a ProfiledOp with its identity
// (id, op), occurrence, µs and one storage of its bytes; the plan's
// save and skip flags and its header's numbers.
struct PlanFile {
  std::vector<ProfiledOp> profile;
  BudgetPlan plan;
};

// The text of `plan`, made from `profile` (one line per op, in order).
std::string planFileText(const std::vector<ProfiledOp>& profile, const BudgetPlan& plan);

// Reads a plan's text. `source` names it in messages (a file path). Throws
// c10::Error naming the source, the line and what is allowed for text that is
// not a plan or is a plan of another format, and for an op that is not
// registered in this process.
PlanFile readPlanFile(const std::string& text, const std::string& source);

}  // namespace hpac
