#include "policy/budget_policy.h"

#include "policy/op_tables.h"
#include "policy/plan_file.h"
#include "policy/selective_policy.h"

#include <c10/util/Exception.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <unordered_map>
#include <unordered_set>

namespace hpac {

const char* toString(BudgetRegion::Stage stage) {
  switch (stage) {
    case BudgetRegion::Stage::kProfiling: return "profiling";
    case BudgetRegion::Stage::kPlanned: return "planned";
    case BudgetRegion::Stage::kFallback: return "fallback (fixed selective policy)";
  }
  return "?";
}

const char* toString(BudgetCost cost) {
  return cost == BudgetCost::kEstimated ? "estimated" : "measured";
}

BudgetCost parseBudgetCost(const std::string& text) {
  if (text == "measured") return BudgetCost::kMeasured;
  if (text == "estimated") return BudgetCost::kEstimated;
  TORCH_CHECK(false, "hpac budget: cost '", text, "' is not allowed; allowed: measured (the profiled kernel times), "
              "estimated (flops and bytes on the device's roofline)");
}

namespace {

void checkBudgetValues(bool has_fraction, double fraction, bool has_bytes, int64_t bytes, int64_t profile_invocations,
                       int64_t max_replans) {
  TORCH_CHECK(has_fraction != has_bytes, "hpac budget: give exactly one of a fraction in [0, 1] or a number of bytes",
              " (got ", has_fraction ? "both" : "neither", ")");
  TORCH_CHECK(!has_fraction || (std::isfinite(fraction) && fraction >= 0 && fraction <= 1), "hpac budget: fraction ",
              fraction, " is outside [0, 1]; 0 recomputes everything (full), 1 keeps as many bytes as checkpointing off keeps");
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
  explicit BudgetPolicy(std::shared_ptr<BudgetRegion> region)
      : region_(std::move(region)), replay_(region_->replayPlan()) {}

  bool wantsProfile() const override { return replay_.stage == BudgetRegion::Stage::kProfiling; }

  void observe(const OpContext&, const ProfiledOp& profile) override { profile_.push_back(profile); }
  void observeAutogradSaved(int64_t storage_id) override {
    // Note [The recompute's fixed cost]: saved while the op observe() will hear of next was the last one counted.
    if (storage_id >= 0) autograd_saved_.push_back(storage_id);
    // A tensor no op output holds (-1) cannot be kept by a plan: under hpac's frame it is held unless the region
    // made it (observeFrameHolds drops it then), under torch's it is waited for like every other.
    saved_at_.emplace_back(storage_id >= 0 ? storage_id : kNeverHeld, profile_.size());
    saw_saved_hook_ = true;
  }
  void observeFrameHolds(bool region_made) override {
    frame_holds_ = true;
    if (!region_made && !saved_at_.empty()) saved_at_.pop_back();  // held whatever the plan keeps
  }

  CheckpointPolicy decide(const OpContext& ctx) override {
    switch (replay_.stage) {
      case BudgetRegion::Stage::kProfiling:
        return CheckpointPolicy::MUST_RECOMPUTE;
      case BudgetRegion::Stage::kFallback:
        return fixed(ctx);
      case BudgetRegion::Stage::kPlanned:
        break;
    }
    const size_t i = position_++;
    if (!diverged_ && (i >= replay_.keys->size() || (*replay_.keys)[i].first != opId(ctx.op) ||
                       (*replay_.keys)[i].second != ctx.occurrence)) {
      diverged_ = true;
      if (!region_->planSource().empty()) throwPlanMismatch(i, ctx);
    }
    if (diverged_) return fixed(ctx);
    return (*replay_.save)[i] ? CheckpointPolicy::MUST_SAVE : CheckpointPolicy::MUST_RECOMPUTE;
  }

  // Note [Frames hold what needs no recompute]: a budget that covers what off keeps holds it as off does.
  bool holdsEverySaved() const override { return replay_.covers_off && !diverged_; }

  bool maySkipInRecompute() const override {
    return replay_.stage == BudgetRegion::Stage::kPlanned && replay_.skip &&
           std::find(replay_.skip->begin(), replay_.skip->end(), true) != replay_.skip->end();
  }

  // Note [Dead ops are skipped]: the plan marks the last decided op as one the recompute need not run.
  bool skipInRecompute() const override {
    if (replay_.stage != BudgetRegion::Stage::kPlanned || diverged_ || !replay_.skip || position_ == 0) return false;
    return position_ - 1 < replay_.skip->size() && (*replay_.skip)[position_ - 1];
  }

  // The plan entry behind the last decide() (explain, replay/explain.h).
  std::string reason() const override {
    switch (replay_.stage) {
      case BudgetRegion::Stage::kProfiling: return "budget profile: recompute every op, time it";
      case BudgetRegion::Stage::kFallback: return "budget fallback to the fixed policy, " + selective_->reason();
      case BudgetRegion::Stage::kPlanned: break;
    }
    const size_t i = position_ - 1;
    if (diverged_) {
      return "budget plan diverged (op sequence differs from the plan), " + selective_->reason();
    }
    return "budget plan entry " + std::to_string(i) + " of " + std::to_string(replay_.keys->size()) + ": " +
           ((*replay_.save)[i] ? "keep"
            : skipInRecompute() ? "recompute; skipped in the recompute (nothing backward needs depends on it)"
                                : "recompute");
  }

  void onPhaseBegin(bool is_recompute) override {
    if (!is_recompute) {
      position_ = 0;
      diverged_ = false;
      profile_.clear();
      autograd_saved_.clear();
      saved_at_.clear();
      saw_saved_hook_ = false;
      frame_holds_ = false;
    }
    if (selective_) selective_->onPhaseBegin(is_recompute);
  }

  void onPhaseEnd(bool is_recompute, bool completed) override {
    if (is_recompute) return;
    if (replay_.stage == BudgetRegion::Stage::kProfiling) {
      std::optional<std::vector<int64_t>> saved;
      for (const auto& [id, at] : saved_at_) {
        if (!profile_.empty()) profile_[std::min(at, profile_.size() - 1)].autograd_saves.push_back(id);
      }
      if (saw_saved_hook_) saved = std::move(autograd_saved_);
      region_->finishProfile(std::move(profile_), std::move(saved), frame_holds_, completed);
    } else if (replay_.stage == BudgetRegion::Stage::kPlanned && completed &&
               (diverged_ || position_ != replay_.keys->size())) {
      region_->planDiverged();
    }
  }

 private:
  // Note [Plan files]: a loaded plan that the region does not follow is the user's error.
  [[noreturn]] void throwPlanMismatch(size_t i, const OpContext& ctx) const {
    const std::string got = qualifiedOpName(ctx.op.operator_name()) + " occurrence " + std::to_string(ctx.occurrence);
    const auto& keys = *replay_.keys;
    const std::string want = i < keys.size() ? qualifiedOpName(operatorNameOf(keys[i].first)) + " occurrence " +
                                                   std::to_string(keys[i].second)
                                             : "the end of the plan (" + std::to_string(keys.size()) + " ops)";
    TORCH_CHECK(false, "hpac budget: the plan '", region_->planSource(), "' does not match the region: its op ", i,
                " is ", want, ", the region's is ", got, ". A plan replays only in the region it was made in, on the "
                "same shapes; make a new one (hpac.budget(fraction) profiles) or give the matching plan");
  }

  CheckpointPolicy fixed(const OpContext& ctx) {
    if (!selective_) {
      selective_ = std::make_unique<SelectivePolicy>(ResolvedOpTables::global());
      selective_->onPhaseBegin(false);
    }
    return selective_->decide(ctx);
  }

  std::shared_ptr<BudgetRegion> region_;
  const BudgetRegion::Replay replay_;  // taken when the invocation starts; a replan reaches the next one
  size_t position_ = 0;
  bool diverged_ = false;
  std::vector<ProfiledOp> profile_;
  std::vector<int64_t> autograd_saved_;  // storage ids (Note [What off keeps])
  // Per tensor autograd saved that a plan must reach: (storage id or kNeverHeld, its op) (Note [The recompute's
  // fixed cost]).
  std::vector<std::pair<int64_t, size_t>> saved_at_;
  bool saw_saved_hook_ = false;
  bool frame_holds_ = false;
  std::unique_ptr<SelectivePolicy> selective_;
};

}  // namespace

namespace {

// The (op, occurrence) of each op of a profile, in order: what a plan replays by.
std::shared_ptr<const std::vector<std::pair<const void*, int64_t>>> keysOf(const std::vector<ProfiledOp>& profile) {
  auto keys = std::make_shared<std::vector<std::pair<const void*, int64_t>>>();
  keys->reserve(profile.size());
  for (const ProfiledOp& p : profile) keys->emplace_back(p.id, p.occurrence);
  return keys;
}

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

BudgetRegion::Replay BudgetRegion::replayPlan() const {
  std::lock_guard<std::mutex> lock(mutex_);
  Replay replay;
  replay.stage = stage_;
  if (stage_ != Stage::kPlanned) return replay;
  replay.keys = keys_;
  replay.save = save_;
  replay.skip = skip_;
  replay.covers_off = plan_.off_bytes >= 0 && plan_.budget_bytes >= plan_.off_bytes;
  return replay;
}

void BudgetRegion::finishProfile(std::vector<ProfiledOp> profile, std::optional<std::vector<int64_t>> autograd_saved,
                                 bool frame_holds, bool completed) {
  if (!completed) return;  // a forward that failed half way profiles nothing
  std::lock_guard<std::mutex> lock(mutex_);
  if (stage_ != Stage::kProfiling) return;  // another invocation finished the profile first
  // Note [Plans from the median profile]
  // One timed forward is one sample of each op's kernel time; on a busy machine a few of them are off by a factor,
  // and the plan follows the noise (the wide block at budget 0.5 kept 23 ops after one profile and 45 after
  // another). With profile_invocations = n the region profiles n forwards and plans from the median time of each
  // (op, occurrence); a profile whose op sequence differs from the earlier ones starts the samples again.
  const bool same_ops = !profile_.empty() && profile_.size() == profile.size() &&
                        std::equal(profile.begin(), profile.end(), profile_.begin(), [](const ProfiledOp& a,
                                                                                        const ProfiledOp& b) {
                          return a.id == b.id && a.occurrence == b.occurrence;
                        });
  if (!same_ops) profiled_micros_.clear();
  std::vector<double> micros;
  micros.reserve(2 * profile.size());
  for (const ProfiledOp& p : profile) micros.push_back(p.micros);
  for (const ProfiledOp& p : profile) micros.push_back(p.gap_micros);  // Note [The recompute's fixed cost]
  profiled_micros_.push_back(std::move(micros));
  profile_ = std::move(profile);
  ++profiles_;
  if (static_cast<int64_t>(profiled_micros_.size()) < spec_.profile_invocations) return;
  auto median = [&](size_t k) {
    std::vector<double> samples;
    for (const auto& m : profiled_micros_) samples.push_back(m[k]);
    std::nth_element(samples.begin(), samples.begin() + samples.size() / 2, samples.end());
    return samples[samples.size() / 2];
  };
  for (size_t i = 0; i < profile_.size(); ++i) {
    profile_[i].micros = spec_.cost == BudgetCost::kEstimated ? profile_[i].estimated_micros : median(i);
    // Note [The recompute's fixed cost]: host time is measured, never estimated; estimated costs plan without it, so
    // that their plan stays the same in every run (Note [Estimated op costs]).
    profile_[i].gap_micros = spec_.cost == BudgetCost::kEstimated ? 0 : median(profile_.size() + i);
  }
  profiled_micros_.clear();
  // Note [What off keeps]: the fraction's 1.0 is what autograd saved of the region's outputs; without a
  // saved-tensor hook (a region entered without a checkpoint) it is every output.
  const int64_t off = autograd_saved ? offKeptBytes(profile_, *autograd_saved) : -1;
  const int64_t base = off >= 0 ? off : totalOutputBytes(profile_);
  const int64_t budget = replanned_bytes_ >= 0 ? replanned_bytes_
                         : spec_.bytes >= 0 ? spec_.bytes
                                            : static_cast<int64_t>(std::floor(spec_.fraction * static_cast<double>(base)));
  autograd_saved_ = std::move(autograd_saved);
  frame_holds_ = frame_holds;
  plan_ = planFor(budget);
  keys_ = keysOf(profile_);
  save_ = std::make_shared<const std::vector<bool>>(plan_.save);
  skip_ = std::make_shared<const std::vector<bool>>(plan_.skip);
  stage_ = Stage::kPlanned;
}

void BudgetRegion::planDiverged() {
  std::lock_guard<std::mutex> lock(mutex_);
  if (stage_ != Stage::kPlanned) return;
  keys_.reset();
  save_.reset();
  skip_.reset();
  if (!plan_source_.empty()) {  // Note [Plan files]: never re-profiled; only a forward shorter than the plan gets here
    stage_ = Stage::kFallback;
    TORCH_WARN("hpac budget: a forward of the region ended before the plan '", plan_source_, "' did (",
               plan_.save.size(), " ops); the plan does not match the region, which keeps the fixed selective "
               "policy from now on");
    return;
  }
  if (replans_ < spec_.max_replans) {
    ++replans_;
    profiles_ = 0;
    profiled_micros_.clear();
    stage_ = Stage::kProfiling;
    return;
  }
  stage_ = Stage::kFallback;
  TORCH_WARN("hpac budget: the region's op sequence differed from its plan ", replans_ + 1,
             " times (dynamic shapes or data-dependent ops such as MoE routing); it keeps the fixed selective "
             "policy from now on.");
}

std::string BudgetRegion::planText() const {
  std::lock_guard<std::mutex> lock(mutex_);
  TORCH_CHECK(stage_ == Stage::kPlanned, "hpac budget: the region has no plan to save (stage '", toString(stage_),
              "'); a plan exists after the region's profile, while it is planned");
  return planFileText(profile_, plan_);
}

BudgetPlan BudgetRegion::planFor(int64_t budget) const {
  BudgetPlan plan = planBudget(profile_, budget, dataflow(), frame_holds_);
  plan.off_bytes = autograd_saved_ ? offKeptBytes(profile_, *autograd_saved_) : -1;
  return plan;
}

void BudgetRegion::checkProfiled(const char* what) const {
  TORCH_CHECK(stage_ == Stage::kPlanned && !profile_.empty() && plan_source_.empty(), "hpac budget: the region has "
              "no profile to ", what, " (stage '", toString(stage_), "'", plan_source_.empty() ? "" : ", a loaded plan",
              "); it has one after its profile, while it is planned");
}

// Note [A forward, op by op]
// The step's forward events (Note [The step's peak as events], policy/step_plan.h) ask what a layer holds at the
// highest moment of its forward under a plan: its transients and what the plan has kept so far. The profile's
// largest transient plus everything the plan keeps bounds it from above, loosely: a layer's largest transient (the
// experts' hidden states, the attention scores) comes part-way, before the later ops' kept outputs exist. A profile
// run while hpac's tracking allocator counts records per op the most bytes alive in the span from the op before's
// return to its own (the tracker's third peak: kernels' scratch and ignored ops included; transients only: the
// profile keeps nothing) and the storages freed in that span. Under a plan keeping a set of storages, the bytes
// alive at any moment of span k are at most the profile's peak of the span plus the kept storages made by op k or
// earlier that the profile had freed by its end; the forward's bytes are the largest over k: an upper bound that
// is exact where the kept storages outlive the span's peak in the profile too. Without the tracker's numbers (a
// region on an accelerator, tracking off) forwardBytes is -1 and the step planner uses the looser bound.
namespace {

int64_t forwardBytes(const std::vector<ProfiledOp>& profile, const std::function<bool(size_t, int64_t)>& keeps) {
  if (profile.empty()) return -1;
  std::unordered_map<int64_t, int64_t> kept;  // storage id -> bytes: kept by the plan, made so far
  std::unordered_set<int64_t> freed;
  int64_t beyond = 0, peak = 0;  // kept storages the profile had freed; the largest live bytes
  for (size_t k = 0; k < profile.size(); ++k) {
    const ProfiledOp& op = profile[k];
    if (op.live_bytes < 0) return -1;
    for (int64_t id : op.freed) {
      if (freed.insert(id).second) {
        const auto it = kept.find(id);
        if (it != kept.end()) beyond += it->second;
      }
    }
    for (const auto& [id, bytes] : op.storages) {
      if (keeps(k, id) && kept.emplace(id, bytes).second && freed.count(id)) beyond += bytes;
    }
    peak = std::max(peak, op.live_bytes + beyond);
  }
  return peak;
}

}  // namespace

BudgetRegion::ForwardBytes BudgetRegion::forwardBytes() const {
  std::lock_guard<std::mutex> lock(mutex_);
  ForwardBytes out;
  if (stage_ != Stage::kPlanned || profile_.empty()) return out;
  out.profiled = hpac::forwardBytes(profile_, [](size_t, int64_t) { return false; });
  if (autograd_saved_) {
    const std::unordered_set<int64_t> saved(autograd_saved_->begin(), autograd_saved_->end());
    out.off = hpac::forwardBytes(profile_, [&](size_t, int64_t id) { return saved.count(id) > 0; });
  }
  return out;
}

std::vector<BudgetRegion::Candidate> BudgetRegion::candidates(const std::vector<int64_t>& budgets) const {
  std::lock_guard<std::mutex> lock(mutex_);
  checkProfiled("plan candidates from");
  std::unordered_set<int64_t> saved;
  if (autograd_saved_) saved.insert(autograd_saved_->begin(), autograd_saved_->end());
  std::vector<Candidate> out;
  for (int64_t budget : budgets) {
    TORCH_CHECK(budget >= 0, "hpac budget: a candidate budget of ", budget, " bytes; allowed: >= 0");
    const BudgetPlan plan = planFor(budget);
    Candidate c{budget, plan.kept_bytes, 0, plan.recompute_micros};
    if (c.recompute_micros < 0) c.recompute_micros = plan.total_micros - plan.saved_micros - plan.skipped_micros;
    std::unordered_set<int64_t> counted;
    int64_t scratch = 0;  // Note [Skipped outputs share one buffer] (replay/dead_ops.cpp): the largest skipped return
    for (size_t i = 0; i < profile_.size(); ++i) {
      if (!plan.skip.empty() && plan.skip[i]) {
        for (const auto& storage : profile_[i].storages) scratch = std::max(scratch, storage.second);
      }
      if (!plan.save[i] || profile_[i].view) continue;
      for (const auto& [id, bytes] : profile_[i].storages) {
        if (autograd_saved_ && !saved.count(id) && counted.insert(id).second) c.backward_bytes += bytes;
      }
    }
    c.backward_bytes += scratch;
    c.forward_bytes =
        hpac::forwardBytes(profile_, [&](size_t i, int64_t) { return plan.save[i] && !profile_[i].view; });
    out.push_back(c);
  }
  return out;
}

void BudgetRegion::replan(int64_t budget_bytes) {
  TORCH_CHECK(budget_bytes >= 0, "hpac budget: replan to ", budget_bytes, " bytes; allowed: >= 0");
  std::lock_guard<std::mutex> lock(mutex_);
  TORCH_CHECK(plan_source_.empty(), "hpac budget: the region replays the plan '", plan_source_, "'; a loaded plan "
              "is not replanned");
  replanned_bytes_ = budget_bytes;  // a profile running now (the op sequence changed) plans with it when it ends
  if (stage_ != Stage::kPlanned || profile_.empty()) return;  // profiling: see above; fallback: the fixed policy
  plan_ = planFor(budget_bytes);
  save_ = std::make_shared<const std::vector<bool>>(plan_.save);
  skip_ = std::make_shared<const std::vector<bool>>(plan_.skip);
}

PlanGroups BudgetRegion::groups() const {
  std::lock_guard<std::mutex> lock(mutex_);
  TORCH_CHECK(stage_ == Stage::kPlanned && !profile_.empty(), "hpac budget: the region has no profile to group "
              "(stage '", toString(stage_), "'); groups exist after the region's profile, while it is planned");
  return planGroups(profile_);
}

std::string BudgetRegion::planTextKeeping(const std::vector<bool>& keep) const {
  std::lock_guard<std::mutex> lock(mutex_);
  TORCH_CHECK(stage_ == Stage::kPlanned && !profile_.empty(), "hpac budget: the region has no profile to plan "
              "from (stage '", toString(stage_), "'); plans exist after the region's profile, while it is planned");
  BudgetPlan plan = planKeeping(profile_, plan_.budget_bytes, keep, dataflow(), frame_holds_);
  plan.off_bytes = plan_.off_bytes;
  return planFileText(profile_, plan);
}

std::shared_ptr<BudgetRegion> BudgetRegion::fromPlanText(const std::string& text, const std::string& source) {
  PlanFile file = readPlanFile(text, source);  // Note [Plan files]
  auto region = std::make_shared<BudgetRegion>(BudgetSpec{-1, file.plan.budget_bytes});
  region->plan_source_ = source.empty() ? "<unnamed plan>" : source;
  region->keys_ = keysOf(file.profile);
  region->profile_ = std::move(file.profile);
  region->save_ = std::make_shared<const std::vector<bool>>(file.plan.save);
  region->skip_ = std::make_shared<const std::vector<bool>>(file.plan.skip);
  region->plan_ = std::move(file.plan);
  region->stage_ = Stage::kPlanned;
  return region;
}

PolicyFactory budgetPolicy(BudgetSpec spec) {
  return std::make_shared<BudgetRegion>(spec)->factory();
}

}  // namespace hpac
