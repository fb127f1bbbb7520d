#include "policy/step_target.h"

#include "policy/byte_size.h"

#include <c10/util/Exception.h>

#include <algorithm>
#include <cstdio>
#include <set>

namespace hpac {

const char* stepEventKindToken(StepEventKind kind) {
  switch (kind) {
    case StepEventKind::kBeforeLayers: return "before_layers";
    case StepEventKind::kForward: return "forward";
    case StepEventKind::kAfterLayer: return "after_layer";
    case StepEventKind::kAfterLayers: return "after_layers";
    case StepEventKind::kBackward: return "backward";
    case StepEventKind::kRest: return "rest";
  }
  return "?";
}

bool parseStepEventKind(const std::string& token, StepEventKind* kind) {
  for (const StepEventKind k : {StepEventKind::kBeforeLayers, StepEventKind::kForward, StepEventKind::kAfterLayer,
                                StepEventKind::kAfterLayers, StepEventKind::kBackward, StepEventKind::kRest}) {
    if (token == stepEventKindToken(k)) {
      *kind = k;
      return true;
    }
  }
  return false;
}

int64_t StepEventKey::layersKept() const {
  switch (kind) {
    case StepEventKind::kForward:
    case StepEventKind::kAfterLayer:
    case StepEventKind::kAfterLayers: return index + 1;
    case StepEventKind::kBackward: return index;
    case StepEventKind::kBeforeLayers:
    case StepEventKind::kRest: return 0;
  }
  return 0;
}

int64_t StepEventKey::ownLayer() const {
  return kind == StepEventKind::kForward || kind == StepEventKind::kBackward ? index : -1;
}

std::string StepEventKey::name() const {
  const std::string i = std::to_string(index);
  switch (kind) {
    case StepEventKind::kBeforeLayers: return "before the layers";
    case StepEventKind::kForward: return "forward of layer " + i;
    case StepEventKind::kAfterLayer: return "after layer " + i;
    case StepEventKind::kAfterLayers: return "after the layers";
    case StepEventKind::kBackward: return "backward of layer " + i;
    case StepEventKind::kRest: return "the rest";
  }
  return "?";
}

namespace {

std::string percent(double v) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.1f%%", 100.0 * v);
  return buf;
}

}  // namespace

StepTarget::StepTarget(int64_t target_bytes, std::vector<std::string> names,
                       std::vector<std::shared_ptr<BudgetRegion>> regions, int64_t params_bytes, int64_t grads_bytes)
    : target_bytes_(target_bytes), regions_(std::move(regions)), params_bytes_(params_bytes),
      grads_bytes_(grads_bytes) {
  TORCH_CHECK(target_bytes_ > 0, "hpac memory target: ", target_bytes_, " bytes; allowed: > 0");
  TORCH_CHECK(!regions_.empty() && names.size() == regions_.size(), "hpac memory target: ", names.size(),
              " layer names for ", regions_.size(), " regions; allowed: one name per region, at least one");
  for (std::string& name : names) {
    LayerPlan plan;
    plan.path = std::move(name);
    plans_.push_back(std::move(plan));
  }
}

void StepTarget::record(const StepEventKey& event, int64_t peak) {
  if (!open_) return;
  int64_t& at = measured_[event];
  at = std::max(at, peak);
}

int64_t StepTarget::held(const StepEventKey& key) const {
  const StepEvent event = stepEvent(0, key.layersKept(), key.ownLayer());
  const auto n = static_cast<int64_t>(plans_.size());
  const bool own = event.layer >= 0 && event.layer < n;
  if (planned_at_ == 0) {  // the profile step: every layer recomputes everything; a forward holds its transients
    return own && event.forward && event.layer < static_cast<int64_t>(profiled_forward_.size())
               ? profiled_forward_[event.layer]
               : 0;
  }
  int64_t held = 0;
  for (int64_t j = 0; j < event.layers_kept && j < n; ++j) held += plans_[j].kept_bytes;
  if (own) held += event.forward ? plans_[event.layer].forward_bytes : plans_[event.layer].backward_bytes;
  return held;
}

void StepTarget::layerCalled(int64_t i) {
  if (open_) called_.push_back(i);
}

std::vector<StepMessage> StepTarget::finishStep(int64_t fragmentation_bytes) {
  std::vector<StepMessage> out;
  if (!open_) return out;
  open_ = false;
  if (planned_at_ == 0 && error_.empty()) {
    std::vector<int64_t> want(plans_.size());
    for (size_t i = 0; i < want.size(); ++i) want[i] = static_cast<int64_t>(i);
    if (called_ != want) {
      std::string got;
      for (int64_t i : called_) got += (got.empty() ? "" : ", ") + plans_.at(i).path;
      error_ = "hpac: memory target: step " + std::to_string(steps_) + " ran the layers in the order [" + got +
               "], not once each in the order given (" + plans_.front().path + " first, " + plans_.back().path +
               " last): the step's events count the layers before each in that order. Give the layers in the "
               "order the forward runs them, each called once per step (one model call per optimizer step: "
               "gradient accumulation is not planned)";
    }
  }
  called_.clear();
  if (measured_.empty()) return out;
  const auto top = std::max_element(measured_.begin(), measured_.end(),
                                    [](const auto& a, const auto& b) { return a.second < b.second; });
  MeasuredStep row;
  row.step = steps_;
  row.measured_bytes = top->second;
  row.measured_event = top->first.name();
  row.planned = planned_at_ != 0;
  if (row.planned) {
    row.predicted_bytes = predicted_bytes_;
    row.predicted_event = predicted_event_;
    row.fragmentation_bytes = fragmentation_bytes;
    const int64_t peak = row.measured_bytes + fragmentation_bytes;
    const std::string head = "memory target " + formatBytes(target_bytes_) + ": step " + std::to_string(steps_) +
                             " measured " + formatBytes(peak) + " at " + row.measured_event;
    if (peak > target_bytes_) {
      out.push_back({true, head + " (predicted " + formatBytes(predicted_bytes_) + " at " + predicted_event_ +
                               "); the plan is tightened for the next step"});
    } else if (!history_.empty() && !history_.back().planned) {  // the first step under the plan
      out.push_back({false, head + ", predicted " + formatBytes(predicted_bytes_) + " at " + predicted_event_ +
                                " (slack " +
                                percent(static_cast<double>(target_bytes_ - peak) / static_cast<double>(target_bytes_)) +
                                ")"});
    }
  }
  history_.push_back(row);
  if (history_.size() > kStepHistory) history_.pop_front();
  if (planned_at_ == 0) {  // Note [A forward, op by op]: what each layer's profile forward held, if measured
    profiled_forward_.assign(regions_.size(), 0);
    for (size_t i = 0; i < regions_.size(); ++i) {
      profiled_forward_[i] = std::max<int64_t>(0, regions_[i]->forwardBytes().profiled);
    }
  }
  // Calibration (Note [Profile, then absolute bases]): a base only ever rises after the plan.
  for (const auto& [event, peak] : measured_) {
    int64_t base = peak - held(event) + (planned_at_ ? fragmentation_bytes : 0);
    if (planned_at_ == 0) {
      if (event.kind != StepEventKind::kRest) base -= start_bytes_;
      bases_[event] = base;
    } else {
      auto it = bases_.find(event);
      bases_[event] = it == bases_.end() ? base : std::max(it->second, base);
    }
  }
  // Note [Room after a step over the target]
  // A step over the target was predicted short by the shortfall: whatever made it (a part of the step the events
  // do not model exactly; MoE routing keeping more in this batch than in the profile's), the bases it raised cover
  // that step, not the next batch. So the plans made after it keep that much room below the target (margin(): the
  // largest shortfall so far), as long as a plan fits with it; otherwise the plan for the target itself.
  if (row.planned && row.measured_bytes + row.fragmentation_bytes > target_bytes_) {
    margin_ = std::max(margin_, row.measured_bytes + row.fragmentation_bytes - predicted_bytes_);
  }
  measured_.clear();
  return out;
}

void StepTarget::startStep(int64_t live_bytes) {
  last_start_ = start_bytes_;
  last_grown_ = steps_ > 0 ? grown_ : -1;
  start_bytes_ = live_bytes;
  grown_ = -1;
  ++steps_;
  open_ = true;
  measured_.clear();
  called_.clear();
}

bool StepTarget::regionsReady() const {
  return std::all_of(regions_.begin(), regions_.end(), [](const std::shared_ptr<BudgetRegion>& r) {
    return r->status().stage == BudgetRegion::Stage::kPlanned;
  });
}

void StepTarget::prepareFirstPlan() {
  TORCH_CHECK(planned_at_ == 0 && steps_ > 0, "hpac memory target: prepareFirstPlan after the first plan");
  // Note [Profile, then absolute bases]: the profile step's start plus what its optimizer step made, if larger.
  const int64_t start = last_grown_ >= 0 ? std::max(start_bytes_, last_start_ + last_grown_) : start_bytes_;
  for (auto& [event, base] : bases_) {
    if (event.kind != StepEventKind::kRest) base += start;
  }
  // Layers of one structure (the same op sequence and sizes) share their candidates.
  std::map<std::tuple<std::vector<std::pair<std::string, int64_t>>, int64_t, int64_t>, size_t> shared;
  candidates_.assign(regions_.size(), {});
  for (size_t i = 0; i < regions_.size(); ++i) {
    const BudgetRegion::Status st = regions_[i]->status();
    const int64_t off = std::max<int64_t>(st.plan.off_bytes, 0);
    plans_[i].off_bytes = off;
    std::vector<std::pair<std::string, int64_t>> ops;
    for (const ProfiledOp& p : st.profile) ops.emplace_back(p.op, p.occurrence);
    const auto key = std::make_tuple(std::move(ops), off, st.plan.total_bytes);
    if (auto it = shared.find(key); it != shared.end()) {
      candidates_[i] = candidates_[it->second];
      continue;
    }
    shared.emplace(key, i);
    std::vector<int64_t> budgets;
    for (int64_t k = 0; k <= kStepCandidateSteps; ++k) budgets.push_back(off * k / kStepCandidateSteps);
    budgets.erase(std::unique(budgets.begin(), budgets.end()), budgets.end());
    // Not checkpointed first: off's bytes, no recompute, no checkpoint around it (it wins ties, Note [An exact
    // step plan]).
    // Note [A forward, op by op]: a forward's bytes are measured with the profile's (or, unmeasured, bounded by
    // the bytes kept: the base then holds the profile's whole transient).
    const bool measured = profiled_forward_.size() == regions_.size() && profiled_forward_[i] > 0;
    const BudgetRegion::ForwardBytes forward = regions_[i]->forwardBytes();
    candidates_[i].push_back(
        StepCandidate{off, off, 0, 0.0, false, measured && forward.off >= 0 ? forward.off : off});
    for (const BudgetRegion::Candidate& c : regions_[i]->candidates(budgets)) {
      candidates_[i].push_back(StepCandidate{c.budget_bytes, c.kept_bytes, c.backward_bytes, c.recompute_micros, true,
                                             measured && c.forward_bytes >= 0 ? c.forward_bytes : c.kept_bytes});
    }
  }
}

void StepTarget::setCandidates(std::vector<std::vector<StepCandidate>> candidates) {
  TORCH_CHECK(candidates.size() == regions_.size(), "hpac memory target: candidates for ", candidates.size(),
              " layers; allowed: ", regions_.size());
  candidates_ = std::move(candidates);
}

std::pair<std::vector<std::vector<StepChoice>>, std::vector<StepEvent>> StepTarget::problem() const {
  std::pair<std::vector<std::vector<StepChoice>>, std::vector<StepEvent>> p;
  for (const auto& cands : candidates_) {
    p.first.emplace_back();
    for (const StepCandidate& c : cands) {
      p.first.back().push_back(StepChoice{c.kept_bytes, c.backward_bytes, c.recompute_micros, c.forward_bytes});
    }
  }
  for (const auto& [event, base] : bases_) p.second.push_back(stepEvent(base, event.layersKept(), event.ownLayer()));
  return p;
}

// Note [Room for a prediction]
// A plan's peak is predicted from measured bases, and a batch is not the one they were measured on: MoE routing
// moves what a layer keeps, and a few allocations fall between the events. Measured on the main job, a first plan's
// prediction was short of step 2's peak by up to 0.3 % of the target (bench/results/memory_target.json, a target at
// 24.65 MiB; docs/results.md). A plan is a promise for every step, the first under it included, so every plan keeps
// kPredictionRoom of the target below it as long as a plan fits with it, and the larger room a step over the target
// left (Note [Room after a step over the target]); otherwise the plan for the target itself.
int64_t StepTarget::room() const {
  return std::max(margin_, static_cast<int64_t>(static_cast<double>(target_bytes_) * kPredictionRoom));
}

StepPlan StepTarget::solve() const {
  const auto [layers, events] = problem();
  if (const int64_t r = room(); r > 0) {
    StepPlan p = planStep(layers, events, target_bytes_ - r);
    if (p.fits) return p;
  }
  return planStep(layers, events, target_bytes_);
}

void StepTarget::seed(std::vector<LayerPlan> layers, std::string source) {
  seed_ = std::move(layers);
  seed_source_ = std::move(source);
}

// Note [A plan file is a first plan]
// A plan made ahead (python -m hpac plan, on the meta device or another machine) chose each layer's budget from a
// step it predicted, not from this run's. Applied as fixed budgets it went over its own target on the real run (the
// main job: 28.36 MiB against a 28 MiB plan predicted at 27.94), and it could not see the training loop's
// conventions (gradients kept through the forward by zero_grad(set_to_none=False): 30.31 MiB). So a plan file runs
// as a target: its target_bytes, with its layers as the first plan where this run's measured profile step predicts
// them within the target less room() — each layer takes its candidate with the largest budget at most the file's
// (or no checkpoint, as the file says) — and this run's own plan otherwise, with a warning naming the difference.
// Every later step is measured and replanned like any target's, so the file's choice is held to the target at
// every step whatever the loop does.
StepPlan StepTarget::seeded(std::string* why) const {
  StepPlan p;
  std::vector<int64_t> choice;
  for (size_t i = 0; i < plans_.size(); ++i) {
    const auto it = std::find_if(seed_.begin(), seed_.end(),
                                 [&](const LayerPlan& l) { return l.path == plans_[i].path; });
    if (it == seed_.end()) {
      *why = "it has no layer " + plans_[i].path;
      return p;
    }
    int64_t pick = -1;
    for (size_t k = 0; k < candidates_[i].size(); ++k) {
      const StepCandidate& c = candidates_[i][k];
      if (c.checkpointed != it->checkpointed || (c.checkpointed && c.budget_bytes > it->budget_bytes)) continue;
      if (pick < 0 || c.budget_bytes > candidates_[i][pick].budget_bytes) pick = static_cast<int64_t>(k);
    }
    if (pick < 0) pick = 0;  // no candidate of the kind the file names: not checkpointed
    choice.push_back(pick);
  }
  const auto [layers, events] = problem();
  p.choice = choice;
  p.peak_bytes = stepPeak(layers, events, choice, &p.peak_event);
  for (size_t i = 0; i < choice.size(); ++i) p.recompute_micros += candidates_[i][choice[i]].recompute_micros;
  p.fits = p.peak_bytes <= target_bytes_ - room();
  if (!p.fits) {
    *why = "its layers are predicted at " + formatBytes(p.peak_bytes) + " on this run's measured step, over the "
           "target less its room " + formatBytes(target_bytes_ - room());
  }
  return p;
}

void StepTarget::apply(const std::vector<int64_t>& choice) {
  for (size_t i = 0; i < choice.size(); ++i) {
    const StepCandidate& c = candidates_[i][choice[i]];
    LayerPlan& p = plans_[i];
    p.checkpointed = c.checkpointed;
    p.budget_bytes = c.budget_bytes;
    p.kept_bytes = c.kept_bytes;
    p.backward_bytes = c.backward_bytes;
    p.recompute_micros = c.recompute_micros;
    p.forward_bytes = c.forward_bytes;
    if (c.checkpointed) regions_[i]->replan(c.budget_bytes);
  }
}

std::vector<StepMessage> StepTarget::plan(const std::string& why) {
  TORCH_CHECK(!candidates_.empty(), "hpac memory target: plan() before prepareFirstPlan()");
  if (planned_at_ == 0) planned_at_ = steps_;
  std::vector<StepMessage> out;
  StepPlan p;
  std::string source;
  if (!seed_.empty()) {  // Note [A plan file is a first plan]
    std::string why;
    p = seeded(&why);
    if (p.fits) {
      source = "the plan of " + seed_source_ + ", checked on this run's measured step: ";
    } else {
      out.push_back({true, "memory target " + formatBytes(target_bytes_) + ": the plan of " + seed_source_ +
                               " is not applied (" + why + "); this run plans from its own profile step"});
    }
    seed_.clear();
  }
  if (!p.fits) p = solve();
  const std::string what =
      p.peak_event >= 0 ? std::next(bases_.begin(), p.peak_event)->first.name() : std::string("(no event)");
  apply(p.choice);
  if (!p.fits) {
    error_ = floorError(p.peak_bytes, what);
    return {};
  }
  predicted_bytes_ = p.peak_bytes;
  predicted_event_ = what;
  int64_t checkpointed = 0, kept = 0;
  double micros = 0;
  for (const LayerPlan& l : plans_) {
    checkpointed += l.checkpointed;
    kept += l.kept_bytes;
    micros += l.recompute_micros;
  }
  std::string text = "memory target " + formatBytes(target_bytes_) + (why.empty() ? "" : " (again: " + why + ")") +
                     ": " + source;
  if (checkpointed == 0) {
    text += "no checkpointing is needed: the step without it is predicted at " + formatBytes(p.peak_bytes) + " (" +
            what + "); every layer runs unwrapped";
  } else {
    char us[32];
    std::snprintf(us, sizeof(us), "%.0f", micros);
    text += std::to_string(checkpointed) + " of " + std::to_string(plans_.size()) + " layers checkpointed, the layers keep " +
            formatBytes(kept) + "; predicted peak " + formatBytes(p.peak_bytes) + " at " + what + ", recompute " + us +
            " µs per step predicted";
  }
  if (margin_ > 0 && p.peak_bytes <= target_bytes_ - margin_) {  // Note [Room after a step over the target]
    text += " (keeping " + formatBytes(margin_) + " below the target, what a step over it was predicted short)";
  }
  out.push_back({false, text});
  return out;
}

std::string StepTarget::floorError(int64_t floor, const std::string& what) const {
  const int64_t start = start_bytes_;
  return "hpac: memory target " + formatBytes(target_bytes_) + " is below this step's floor " + formatBytes(floor) +
         " (every layer recomputed), set by " + what + ": live at the step's start " + formatBytes(start) +
         " (parameters " + formatBytes(params_bytes_) + "; optimizer state and the rest " +
         formatBytes(start - params_bytes_) + "), gradients up to " + formatBytes(grads_bytes_) + ", and what " + what +
         " holds beside them " + formatBytes(std::max<int64_t>(0, floor - start - grads_bytes_)) +
         " (the logits and the loss after the layers; one layer's recompute and its gradients in a backward). To lower "
         "the floor: shard over more FSDP ranks, a smaller micro-batch, a shorter sequence; or name a target of at "
         "least the floor";
}

std::pair<int64_t, std::string> StepTarget::predict() const {
  int64_t best = 0;
  std::string what;
  for (const auto& [event, base] : bases_) {
    const int64_t live = base + held(event);
    if (live > best) {
      best = live;
      what = event.name();
    }
  }
  return {best, what};
}

bool StepTarget::needsReplan() const { return planned_at_ != 0 && predict().first > target_bytes_; }

std::vector<std::pair<int64_t, double>> StepTarget::uniformPlans() const {
  std::vector<std::pair<int64_t, double>> out;
  if (planned_at_ == 0 || candidates_.empty()) return out;
  size_t k_max = candidates_[0].size();
  for (const auto& c : candidates_) k_max = std::min(k_max, c.size());
  const auto [layers, events] = problem();
  for (size_t k = 0; k < k_max; ++k) {
    std::vector<int64_t> choice(layers.size(), static_cast<int64_t>(k));
    double micros = 0;
    for (const auto& cands : candidates_) micros += cands[k].recompute_micros;
    out.emplace_back(stepPeak(layers, events, choice), micros);
  }
  return out;
}

StepRecord StepTarget::record() const {
  StepRecord r;
  r.target_bytes = target_bytes_;
  r.predicted_bytes = predicted_bytes_;
  r.predicted_event = predicted_event_;
  r.planned_at_step = planned_at_;
  r.margin_bytes = margin_;
  r.error = error_;
  if (!history_.empty()) {
    r.measured_bytes = history_.back().measured_bytes;
    r.measured_event = history_.back().measured_event;
  }
  r.layers = plans_;
  for (const auto& [event, base] : bases_) r.events.emplace_back(event.name(), base);
  r.history.assign(history_.begin(), history_.end());
  return r;
}

}  // namespace hpac
