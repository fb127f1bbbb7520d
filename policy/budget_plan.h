// hpac/policy/budget_plan.h
//
// The memory-budget planner: from one profiled forward of a region — per
// (op, occurrence) the storages its outputs live in with their bytes, and the
// measured kernel time — choose the outputs to keep so that the kept bytes fit
// a budget and the recompute time left is least. Plain C++: no dispatcher, no
// tensors; budget_policy.h feeds it and replays its answer.
//
// Note [Budget as a knapsack]
// Outputs that share a storage (a view and its base, an in-place result and
// its argument, the values and indices of one op) are one group: keeping one
// member keeps the storage alive, after which keeping the others costs
// nothing, so a group is kept whole or not at all. Its weight is the sum of
// its distinct storages' bytes, its value the sum of its members' kernel
// times (the recompute time avoided by keeping it). Choosing groups is a 0/1
// knapsack. Groups without bytes (outputs that are not tensors) are always
// kept. planBudget solves it exactly by dynamic programming over weights
// rounded UP to units of u = ceil(budget / kResolution) bytes: every plan it
// returns fits the real budget, and it is optimal among the plans that fit a
// budget of (budget - k*u) for k the number of groups it keeps (each group
// loses less than u bytes to the rounding). With kResolution = 4096, a plan
// keeping 40 groups is optimal for at least 99% of the budget.
//
// Note [Collectives are kept by every plan]
// Each rank profiles and plans on its own, from its own timings, so two
// ranks' plans may differ. For most ops that is harmless (each rank replays
// its own decisions), but a collective recomputed on one rank and served on
// another would leave the first waiting for a partner that never comes. So,
// as in the fixed selective policy, collectives are always kept: their groups
// are kept before the knapsack, their bytes taken from the budget first (a
// plan may then exceed a budget smaller than the collectives' own bytes).
//
// Views are left out of the groups and never kept: their outputs hold no
// bytes of their own, and the invocation would not obey a save of them anyway
// (Note [Views are recomputed] in replay/invocation.cpp).
//
// Note [What off keeps]
// A budget fraction is of what the region keeps with checkpointing off: the
// outputs autograd saves for backward (relu's result, the inputs of a matmul
// that are outputs of earlier ops, ...), not every output (most are freed
// as soon as the next op has read them). The checkpoint's saved-tensor hook
// reports each tensor autograd saves during the profile forward
// (Policy::observeAutogradSaved); offKeptBytes() sums the distinct storages
// among the region's op outputs that those tensors live in. Tensors that are
// no op's output (the region's inputs, parameters) are kept in every mode and
// do not count. 1.0 therefore keeps at most what off keeps; the planner may
// still keep outputs off would free, when that buys more recompute time.
#pragma once

#include "policy/profiled_op.h"

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace hpac {

struct BudgetPlan {
  std::vector<bool> save;     // per profiled op, in profile order
  // Per profiled op: not saved, and nothing the backward needs depends on it
  // (Note [Dead ops are skipped]); empty when the profile did not say what
  // autograd saves.
  std::vector<bool> skip;
  int64_t budget_bytes = 0;
  int64_t kept_bytes = 0;     // distinct storage bytes of what is saved
  int64_t total_bytes = 0;    // distinct storage bytes of every output: the keep-everything point
  // Distinct storage bytes of the outputs autograd saved in the profile
  // (Note [What off keeps]); -1 when no saved-tensor hook reported (a region
  // entered without a checkpoint around it).
  int64_t off_bytes = -1;
  double saved_micros = 0;    // kernel time the recompute no longer spends: saved ops
  double skipped_micros = 0;  // and skipped ops (Note [Dead ops are skipped])
  double total_micros = 0;    // kernel time of every profiled op
  int64_t groups = 0;         // storage groups (Note [Budget as a knapsack])
  int64_t kept_groups = 0;
};

constexpr int64_t kBudgetResolution = 4096;

// Note [Dead ops are skipped]
// The recompute exists to give backward the tensors autograd saved. Given the
// outputs a plan keeps, an op that is not kept is needed only if a storage
// autograd saved, or a needed op's argument, lives in what it returns; ops
// with other effects (in-place writes, random numbers, values read back by
// Python such as item(), collectives, any op not skippable) are always
// needed; so is every op with an integer or bool result, since Python reads
// those back without an op hpac sees (an expert-parallel MoE's token counts:
// `counts.sum(1).tolist()` as all-to-all split sizes; skipped, the recompute
// split by uninitialised sizes), and so are the arguments of the ignored ops
// (copy_, detach) that ran between counted ops. One backward pass over the
// profile finds the needed set; every other op is skipped in the recompute:
// the invocation hands back uninitialised tensors of the forward's sizes and
// strides instead of running the kernel (Invocation, Action::kSkip). Nothing
// the backward reads comes from a skipped op, by construction; the recompute
// still runs the same op sequence, so the replay checks hold. Views are never skipped
// (they run no kernel) but pass need on to their base only when needed.
//
// The plan for a budget in bytes (>= 0; more than total_bytes keeps
// everything). With autograd_saved (Note [What off keeps]) it also marks the
// ops the recompute skips.
BudgetPlan planBudget(const std::vector<ProfiledOp>& ops, int64_t budget_bytes,
                      const std::vector<int64_t>* autograd_saved = nullptr);

// Note [Dead ops are skipped]: which ops a recompute that is served `save`
// need not run.
std::vector<bool> deadOps(const std::vector<ProfiledOp>& ops, const std::vector<bool>& save,
                          const std::vector<int64_t>& autograd_saved);

// The keep-everything point of a profile (distinct storage bytes of all outputs).
int64_t totalOutputBytes(const std::vector<ProfiledOp>& ops);

// What off keeps of a profile (Note [What off keeps]): the distinct bytes of
// the storages in `autograd_saved` that some non-view op's outputs hold.
int64_t offKeptBytes(const std::vector<ProfiledOp>& ops, const std::vector<int64_t>& autograd_saved);

}  // namespace hpac
