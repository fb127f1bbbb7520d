#include "policy/selective_policy.h"

namespace hpac {

CheckpointPolicy SelectivePolicy::decide(const OpContext& ctx) {
  switch (tables_.classify(ctx.op)) {
    case OpCategory::kRecompute:
      return CheckpointPolicy::MUST_RECOMPUTE;
    case OpCategory::kMatmul: {
      // See Note [Per-phase counters].
      const int64_t n = matmul_count_[ctx.is_recompute ? 1 : 0]++;
      return n % 2 == 0 ? CheckpointPolicy::MUST_SAVE : CheckpointPolicy::MUST_RECOMPUTE;
    }
    case OpCategory::kSave:
      return CheckpointPolicy::MUST_SAVE;
    case OpCategory::kIgnored:  // replay filters these first; recompute if asked directly
    case OpCategory::kOther:
      return CheckpointPolicy::MUST_RECOMPUTE;
  }
  return CheckpointPolicy::MUST_RECOMPUTE;
}

PolicyFactory selectivePolicy() {
  const ResolvedOpTables& tables = ResolvedOpTables::global();
  return [&tables]() -> std::unique_ptr<Policy> { return std::make_unique<SelectivePolicy>(tables); };
}

}  // namespace hpac
