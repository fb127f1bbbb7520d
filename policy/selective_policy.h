// hpac/policy/selective_policy.h
//
// The built-in selective policy (the reference design's section 6.3: docs/design.md), checked in
// this order for every op, per invocation and per phase:
//   1. aten::topk                  -> MUST_RECOMPUTE
//   2. matmul family               -> 1st, 3rd, 5th... call MUST_SAVE,
//                                     2nd, 4th... MUST_RECOMPUTE
//   3. save set (compute-intensive, attention, aten::max, collectives)
//                                  -> MUST_SAVE
//   4. everything else             -> MUST_RECOMPUTE
// The tables are in op_tables.cpp; ignored ops never reach a policy.
//
// Note [Per-phase counters]
// The matmul counter is kept per invocation and per phase. A single counter
// shared by forward and recompute would start the recompute at an odd offset
// whenever the forward saw an odd number of matmuls, so every decision in the
// recompute would be inverted: saved outputs looked up that were never stored,
// or stored outputs served to the wrong call. The replay now asks a policy in
// the forward only (Note [Decisions are recorded]), which makes that
// impossible for any policy; the counters stay per phase so that the policy
// answers the same when called directly for either phase (tests, explain).
#pragma once

#include "policy/checkpoint_policy.h"
#include "policy/op_tables.h"

namespace hpac {

class SelectivePolicy final : public Policy {
 public:
  explicit SelectivePolicy(const ResolvedOpTables& tables) : tables_(tables) {}
  CheckpointPolicy decide(const OpContext& ctx) override;
  // "rule 1 (recompute table)", "rule 2 (matmul family, call 3: odd calls save)", ...
  std::string reason() const override;
  void onPhaseBegin(bool is_recompute) override { matmul_count_[is_recompute ? 1 : 0] = 0; }

  // Matmul-family calls seen so far in the given phase.
  int64_t matmulCount(bool is_recompute) const { return matmul_count_[is_recompute ? 1 : 0]; }

 private:
  const ResolvedOpTables& tables_;
  int64_t matmul_count_[2] = {0, 0};
  OpCategory last_category_ = OpCategory::kOther;  // of the last decide(), for reason()
  int64_t last_matmul_ = -1;                       // its matmul call index (0-based), when rule 2
};

// Factory for the built-in selective policy over the process-wide tables
// (resolved on the first call).
PolicyFactory selectivePolicy();

}  // namespace hpac
