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
// kept. planBudget solves it by dynamic programming from both sides and takes
// the better: over the bytes kept, weights rounded UP to units of
// u = budget / R (every choice fits the real budget; each kept group loses
// less than u to the rounding), and over the bytes to free, weights rounded
// DOWN to units of (total - budget) / R (every choice frees at least what it
// must; the error is a share of what is freed, which is small exactly when the
// budget is most of the total, where the first side is weakest). What rounding
// leaves of the budget is then filled with the groups that still fit, most
// value per byte first. R = 4096 states, 64 per group for more than 64 groups,
// at most 2^16. Measured against the exact optimum (Note [An exact oracle for
// the planner]): with only the first side, unfilled, at R = 4096, plans left
// up to 2x the optimum's recompute time at budget 0.9 (600 groups; 11% with
// 80); now within 1% on every profile the oracle tests hold.
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
  // Note [The recompute's fixed cost]: the recompute's predicted time, host gaps included, up to where it stops;
  // -1 without dataflow (no saved-tensor hook reported, or skip_dead off).
  double recompute_micros = -1;
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
// strides instead of running the kernel (Action::kSkip; replay/dead_ops.h). Nothing
// the backward reads comes from a skipped op, by construction; the recompute
// still runs the same op sequence, so the replay checks hold. Views are never skipped
// (they run no kernel) but pass need on to their base only when needed.
//
// Note [The recompute's fixed cost]
// A recompute re-runs the region's code until it has what backward needs.
// Every op it reaches costs the host time around it (module code, dispatch,
// autograd recording, hooks: ProfiledOp::gap_micros), whether it is served,
// skipped or run, and its kernel when it runs. Where it ends depends on the
// frame: hpac's frames hold what needs no recompute and stop after the last
// saved tensor they do not hold (Note [The recompute stops early],
// replay/checkpoint.cpp); torch.utils.checkpoint's frame holds nothing and
// stops after the last tensor autograd saved. On small layers the host time
// is most of the recompute (docs/results.md, "Where the main job's recompute
// time goes"), and a plan that weighs kernels only cannot see it: serving an
// op removes its kernel, not its host time, while keeping what the tail of a
// region saves lets an early-stopping recompute end before the tail and pay
// nothing there. So the dataflow plans (Note [Planning with the dataflow])
// are judged by the predicted recompute time: the gaps and the kernels that
// run, over the ops up to where it stops (ProfiledOp::autograd_saves says
// where each saved tensor is packed). And one family of candidates more: for
// each op p during which autograd saved something, keep every group holding
// what autograd saved after p, so that the recompute stops at p, and fill what
// the budget leaves with the knapsack over the other groups. Profiles without
// gaps and positions (plan files from before) are judged as before; estimated
// costs (Note [Estimated op costs]) plan with the positions but no gaps, since
// host time is measured, not estimated, and their plans must not move.
//
// The plan for a budget in bytes (>= 0; more than total_bytes keeps
// everything). With autograd_saved (Note [What off keeps]) it also marks the
// ops the recompute skips; `stops_early`: the frame holds what needs no
// recompute and stops early (Note [The recompute's fixed cost]).
BudgetPlan planBudget(const std::vector<ProfiledOp>& ops, int64_t budget_bytes,
                      const std::vector<int64_t>* autograd_saved = nullptr, bool stops_early = false);

// Note [An exact oracle for the planner]
// The knapsack is exact for its additive objective only up to its rounding
// (Note [Budget as a knapsack]), and the dataflow candidates are heuristics
// (Note [Planning with the dataflow]). Tests and benchmarks hold both against
// an exact solver outside hpac (a MILP over the same groups, scipy's milp:
// hpac.harness.plan_oracle), which needs the groups the planner chooses
// among, and the plan that keeps a set of groups chosen elsewhere (replayed by
// hpac like its own: Note [Plan files], policy/plan_file.h).
struct PlanGroups {
  std::vector<int64_t> group_of;  // per profiled op: its group, -1 for a view (never kept)
  std::vector<int64_t> bytes;     // per group: distinct storage bytes
  std::vector<double> micros;     // per group: summed kernel time
  std::vector<bool> collective;   // per group: kept by every plan (Note [Collectives are kept by every plan])
};
PlanGroups planGroups(const std::vector<ProfiledOp>& ops);

// The plan keeping exactly the groups `keep` says (per group of planGroups(ops);
// groups without bytes and collectives are kept whatever it says), with every
// field planBudget fills; it may exceed budget_bytes.
BudgetPlan planKeeping(const std::vector<ProfiledOp>& ops, int64_t budget_bytes, const std::vector<bool>& keep,
                       const std::vector<int64_t>* autograd_saved = nullptr, bool stops_early = false);

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
