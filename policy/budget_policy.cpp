#include "policy/budget_policy.h"

#include "policy/op_tables.h"
#include "policy/selective_policy.h"

#include <c10/util/Exception.h>

#include <cmath>

namespace hpac {

const char* toString(BudgetRegion::Stage stage) {
  switch (stage) {
    case BudgetRegion::Stage::kProfiling: return "profiling";
    case BudgetRegion::Stage::kPlanned: return "planned";
    case BudgetRegion::Stage::kFallback: return "fallback (fixed selective policy)";
  }
  return "?";
}

namespace {

void checkBudgetValues(bool has_fraction, double fraction, bool has_bytes, int64_t bytes, int64_t profile_invocations,
                       int64_t max_replans) {
  TORCH_CHECK(has_fraction != has_bytes, "hpac budget: give exactly one of a fraction in [0, 1] or a number of bytes",
              " (got ", has_fraction ? "both" : "neither", ")");
  TORCH_CHECK(!has_fraction || (std::isfinite(fraction) && fraction >= 0 && fraction <= 1), "hpac budget: fraction ",
              fraction, " is outside [0, 1]; 0 recomputes everything (full), 1 keeps every output");
  TORCH_CHECK(!has_bytes || bytes >= 0, "hpac budget: bytes ", bytes, " is negative; allowed: >= 0");
  TORCH_CHECK(profile_invocations >= 1, "hpac budget: profile_invocations ", profile_invocations,
              " is not allowed; allowed: >= 1");
  TORCH_CHECK(max_replans >= 0, "hpac budget: max_replans ", max_replans, " is negative; allowed: >= 0");
}

}  // namespace

void validateBudgetSpec(const BudgetSpec& spec) {
  checkBudgetValues(spec.fraction != -1, spec.fraction, spec.bytes != -1, spec.bytes, spec.profile_invocations,
                    spec.max_replans);
}

BudgetSpec makeBudgetSpec(std::optional<double> fraction, std::optional<int64_t> bytes, int64_t profile_invocations,
                          int64_t max_replans) {
  checkBudgetValues(fraction.has_value(), fraction.value_or(0), bytes.has_value(), bytes.value_or(0),
                    profile_invocations, max_replans);
  BudgetSpec spec;
  spec.fraction = fraction.value_or(-1);
  spec.bytes = bytes.value_or(-1);
  spec.profile_invocations = profile_invocations;
  spec.max_replans = max_replans;
  return spec;
}

namespace {

// One invocation's policy: profiles, replays the plan, or falls back.
class BudgetPolicy final : public Policy {
 public:
  explicit BudgetPolicy(std::shared_ptr<BudgetRegion> region) : region_(std::move(region)) {
    region_->planFor(&keys_, &save_, &stage_);
    if (stage_ != BudgetRegion::Stage::kPlanned) keys_.reset(), save_.reset();
  }

  bool wantsProfile() const override { return stage_ == BudgetRegion::Stage::kProfiling; }

  void observe(const OpContext&, const ProfiledOp& profile) override { profile_.push_back(profile); }

  CheckpointPolicy decide(const OpContext& ctx) override {
    switch (stage_) {
      case BudgetRegion::Stage::kProfiling:
        return CheckpointPolicy::MUST_RECOMPUTE;
      case BudgetRegion::Stage::kFallback:
        return fixed(ctx);
      case BudgetRegion::Stage::kPlanned:
        break;
    }
    const size_t i = position_++;
    if (!diverged_ && (i >= keys_->size() || (*keys_)[i].first != opId(ctx.op) ||
                       (*keys_)[i].second != ctx.occurrence)) {
      diverged_ = true;
    }
    if (diverged_) return fixed(ctx);
    return (*save_)[i] ? CheckpointPolicy::MUST_SAVE : CheckpointPolicy::MUST_RECOMPUTE;
  }

  // The plan entry behind the last decide() (explain, replay/explain.h).
  std::string reason() const override {
    switch (stage_) {
      case BudgetRegion::Stage::kProfiling: return "budget profile: recompute every op, time it";
      case BudgetRegion::Stage::kFallback: return "budget fallback to the fixed policy, " + selective_->reason();
      case BudgetRegion::Stage::kPlanned: break;
    }
    const size_t i = position_ - 1;
    if (diverged_) {
      return "budget plan diverged (op sequence differs from the plan), " + selective_->reason();
    }
    return "budget plan entry " + std::to_string(i) + " of " + std::to_string(keys_->size()) + ": " +
           ((*save_)[i] ? "keep" : "recompute");
  }

  void onPhaseBegin(bool is_recompute) override {
    if (!is_recompute) position_ = 0, diverged_ = false, profile_.clear();
    if (selective_) selective_->onPhaseBegin(is_recompute);
  }

  void onPhaseEnd(bool is_recompute, bool completed) override {
    if (is_recompute) return;
    if (stage_ == BudgetRegion::Stage::kProfiling) {
      region_->finishProfile(std::move(profile_), completed);
    } else if (stage_ == BudgetRegion::Stage::kPlanned && completed && (diverged_ || position_ != keys_->size())) {
      region_->planDiverged();
    }
  }

 private:
  CheckpointPolicy fixed(const OpContext& ctx) {
    if (!selective_) {
      selective_ = std::make_unique<SelectivePolicy>(ResolvedOpTables::global());
      selective_->onPhaseBegin(false);
    }
    return selective_->decide(ctx);
  }

  std::shared_ptr<BudgetRegion> region_;
  BudgetRegion::Stage stage_;
  std::shared_ptr<const std::vector<std::pair<const void*, int64_t>>> keys_;
  std::shared_ptr<const std::vector<bool>> save_;
  size_t position_ = 0;
  bool diverged_ = false;
  std::vector<ProfiledOp> profile_;
  std::unique_ptr<SelectivePolicy> selective_;
};

}  // namespace

BudgetRegion::BudgetRegion(BudgetSpec spec) : spec_(spec) {
  validateBudgetSpec(spec_);
}

PolicyFactory BudgetRegion::factory() {
  std::shared_ptr<BudgetRegion> self = shared_from_this();
  return [self] { return std::make_unique<BudgetPolicy>(self); };
}

BudgetRegion::Status BudgetRegion::status() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return Status{stage_, profiles_, replans_, profile_, plan_};
}

bool BudgetRegion::planFor(std::shared_ptr<const std::vector<std::pair<const void*, int64_t>>>* keys,
                           std::shared_ptr<const std::vector<bool>>* save, Stage* stage) const {
  std::lock_guard<std::mutex> lock(mutex_);
  *keys = keys_;
  *save = save_;
  *stage = stage_;
  return stage_ == Stage::kPlanned;
}

void BudgetRegion::finishProfile(std::vector<ProfiledOp> profile, bool completed) {
  if (!completed) return;  // a forward that failed half way profiles nothing
  std::lock_guard<std::mutex> lock(mutex_);
  if (stage_ != Stage::kProfiling) return;  // another invocation finished the profile first
  profile_ = std::move(profile);
  if (++profiles_ < spec_.profile_invocations) return;
  const int64_t total = totalOutputBytes(profile_);
  const int64_t budget =
      spec_.bytes >= 0 ? spec_.bytes : static_cast<int64_t>(std::floor(spec_.fraction * static_cast<double>(total)));
  plan_ = planBudget(profile_, budget);
  auto keys = std::make_shared<std::vector<std::pair<const void*, int64_t>>>();
  keys->reserve(profile_.size());
  for (const ProfiledOp& p : profile_) keys->emplace_back(p.id, p.occurrence);
  keys_ = std::move(keys);
  save_ = std::make_shared<const std::vector<bool>>(plan_.save);
  stage_ = Stage::kPlanned;
}

void BudgetRegion::planDiverged() {
  std::lock_guard<std::mutex> lock(mutex_);
  if (stage_ != Stage::kPlanned) return;
  keys_.reset();
  save_.reset();
  if (replans_ < spec_.max_replans) {
    ++replans_;
    profiles_ = 0;
    stage_ = Stage::kProfiling;
    return;
  }
  stage_ = Stage::kFallback;
  TORCH_WARN("hpac budget: the region's op sequence differed from its plan ", replans_ + 1,
             " times (dynamic shapes or data-dependent ops such as MoE routing); it keeps the fixed selective "
             "policy from now on.");
}

PolicyFactory budgetPolicy(BudgetSpec spec) {
  return std::make_shared<BudgetRegion>(spec)->factory();
}

}  // namespace hpac
