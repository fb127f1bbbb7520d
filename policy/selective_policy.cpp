#include "policy/selective_policy.h"

namespace hpac {

CheckpointPolicy SelectivePolicy::decide(const OpContext& ctx) {
  last_category_ = tables_.classify(ctx.op);
  switch (last_category_) {
    case OpCategory::kRecompute:
      return CheckpointPolicy::MUST_RECOMPUTE;
    case OpCategory::kMatmul: {
      // See Note [Per-phase counters].
      const int64_t n = last_matmul_ = matmul_count_[ctx.is_recompute ? 1 : 0]++;
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

std::string SelectivePolicy::reason() const {
  switch (last_category_) {
    case OpCategory::kRecompute: return "selective rule 1: recompute table";
    case OpCategory::kMatmul:
      return "selective rule 2: matmul family, call " + std::to_string(last_matmul_ + 1) +
             (last_matmul_ % 2 == 0 ? " (odd: save)" : " (even: recompute)");
    case OpCategory::kSave: return "selective rule 3: save table";
    case OpCategory::kIgnored:
    case OpCategory::kOther: return "selective rule 4: not in any table, recompute";
  }
  return "selective";
}

PolicyFactory selectivePolicy() {
  const ResolvedOpTables& tables = ResolvedOpTables::global();
  return [&tables]() -> std::unique_ptr<Policy> { return std::make_unique<SelectivePolicy>(tables); };
}

}  // namespace hpac
