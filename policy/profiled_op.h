// hpac/policy/profiled_op.h
//
// ProfiledOp: what one counted op of a profiled forward costs and touches, as
// the replay layer measures it and hands it to a policy (Policy::observe in
// policy/checkpoint_policy.h). The budget planner (policy/budget_plan.h) plans
// from a sequence of them; the policy interface needs only this record, not the
// planner.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace hpac {

// ProfiledOp::autograd_saves: a saved tensor no plan can keep (Note [The recompute's fixed cost]).
constexpr int64_t kNeverHeld = -2;

struct ProfiledOp {
  std::string op;          // "aten::mm", "aten::max.dim": name and overload
  const void* id = nullptr;  // the op's identity in this process (policy/op_tables.h OpId)
  int64_t occurrence = 0;  // of this op within the forward
  double micros = 0;       // measured kernel time
  // Note [Estimated op costs] (replay/op_cost.h): what it computes and moves,
  // and the time the device's roofline gives for that.
  double flops = 0;
  int64_t bytes_moved = 0;
  double estimated_micros = 0;
  // (storage id, bytes) of each tensor output; ids are any integers equal for
  // equal storages within one profile.
  std::vector<std::pair<int64_t, int64_t>> storages;
  // A view op (a return aliases an argument without writing it: t, view,
  // select, unsqueeze, ...): never kept. Recomputing it runs no kernel, and a
  // served view breaks autograd's view tracking on torch 2.x (Note [Views are
  // recomputed]).
  bool view = false;
  // Dataflow, for Note [Dead ops are skipped]: the storage ids of its tensor
  // arguments, of the storages its tensor returns live in (an in-place
  // result: its argument's), and those read by ignored ops (not counted, so
  // not profiled) that ran after it and before the next counted op.
  std::vector<int64_t> reads;
  std::vector<int64_t> writes;
  std::vector<int64_t> later_reads;
  // A kernel whose only effect is its returns (aten, not mutable, not seeded
  // random, every return a fresh dense tensor): the recompute may skip it.
  bool skippable = false;
  // A collective (c10d, _c10d_functional): always kept (Note [Collectives are
  // kept by every plan]).
  bool collective = false;
  // Note [The recompute's fixed cost] (policy/budget_plan.h): the host time
  // between the previous counted op's end and this op's start (module code,
  // dispatch, autograd recording, the ops hpac ignores), which a recompute
  // that reaches this op pays whatever the plan keeps; and the storage ids of
  // the tensors autograd saved for backward while this op was the last one
  // counted (its arguments before it ran, its results after).
  // kNeverHeld: a tensor no plan can keep (made by an op hpac does not count).
  double gap_micros = 0;
  std::vector<int64_t> autograd_saves;
  // Note [A forward, op by op] (policy/budget_policy.cpp): the most CPU tensor
  // bytes alive from the op before's return to this op's, above those alive
  // when the forward began (-1: not measured: hpac's tracking allocator is not
  // installed, or the op's returns are not on the CPU), and the ids of the
  // storages named earlier in the profile that were freed in that span.
  int64_t live_bytes = -1;
  std::vector<int64_t> freed;
};

}  // namespace hpac
