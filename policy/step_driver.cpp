#include "policy/step_driver.h"

#include <c10/util/Exception.h>

#include <algorithm>
#include <cstdio>
#include <map>
#include <sstream>
#include <utility>

namespace hpac {

namespace {

constexpr const char* kStateFormat = "hpac-step-state 1";

// One rank's state() as merge() reads it.
struct RankState {
  bool ready = false;
  int64_t margin = 0;
  std::map<StepEventKey, int64_t> bases;
  std::vector<std::vector<StepCandidate>> candidates;
};

RankState readState(const std::string& text, size_t rank) {
  std::istringstream in(text);
  std::string line;
  const auto bad = [&](const std::string& what) {
    TORCH_CHECK(false, "hpac memory target: rank ", rank, "'s step state ", what, " (line '", line,
                "'); allowed: the text StepDriver::state() writes (", kStateFormat, ") from the same hpac");
  };
  if (!std::getline(in, line) || line != kStateFormat) bad("has another format");
  RankState s;
  while (std::getline(in, line)) {
    std::istringstream fields(line);
    std::string tag;
    fields >> tag;
    if (tag == "ready") {
      int ready = 0;
      if (!(fields >> ready)) bad("has a bad ready line");
      s.ready = ready != 0;
    } else if (tag == "margin") {
      if (!(fields >> s.margin)) bad("has a bad margin");
    } else if (tag == "base") {
      std::string kind;
      StepEventKey key;
      int64_t bytes = 0;
      if (!(fields >> kind >> key.index >> bytes) || !parseStepEventKind(kind, &key.kind)) bad("has a bad event");
      s.bases[key] = bytes;
    } else if (tag == "layer") {
      s.candidates.emplace_back();
    } else if (tag == "candidate") {
      StepCandidate c;
      int checkpointed = 0;
      if (s.candidates.empty() || !(fields >> c.budget_bytes >> c.kept_bytes >> c.backward_bytes >> c.forward_bytes >>
                                    c.recompute_micros >> checkpointed)) {
        bad("has a bad candidate");
      }
      c.checkpointed = checkpointed != 0;
      s.candidates.back().push_back(c);
    } else if (!tag.empty()) {
      bad("has an unknown line");
    }
  }
  return s;
}

std::string candidateCounts(const std::vector<RankState>& all) {
  std::string out;
  for (const RankState& s : all) {
    out += out.empty() ? "[" : ", ";
    out += std::to_string(s.candidates.size()) + " layers";
  }
  return out + "]";
}

}  // namespace

StepDriver::StepDriver(std::unique_ptr<StepTarget> target, bool measure_only)
    : target_(std::move(target)), measure_only_(measure_only),
      layers_(static_cast<int64_t>(target_->layerPlans().size())) {}

void StepDriver::open(std::optional<StepEventKey> next, int64_t peak) {
  if (open_) target_->record(*open_, peak);
  open_ = std::move(next);
}

std::vector<StepMessage> StepDriver::close(int64_t peak, int64_t fragmentation) {
  open(std::nullopt, peak);
  return target_->finishStep(fragmentation);
}

std::vector<StepMessage> StepDriver::stepBegins(int64_t peak, int64_t live, int64_t fragmentation) {
  if (watching_ && since_optimizer_ > 0 && error_.empty()) {
    error_ = "hpac: memory target: the model was called again without optimizer.step() between (gradient "
             "accumulation): the target plans one model call per optimizer step; call it once per step, or make the "
             "target without optimizer= (each call is then planned as a step of its own)";
  }
  ++since_optimizer_;
  std::vector<StepMessage> out = close(peak, fragmentation);
  if (!error().empty()) return out;
  target_->startStep(live);
  rest_open_ = false;
  optimizer_live_ = -1;
  ranks_ready_ = !measure_only_ && target_->wantsFirstPlan() && target_->regionsReady();
  if (ranks_ready_) target_->prepareFirstPlan();  // Note [Profile, then absolute bases]; the candidates
  return out;
}

std::vector<StepMessage> StepDriver::beforeLayers(int64_t peak) {
  std::vector<StepMessage> out;
  if (error().empty() && !measure_only_) {
    if (target_->wantsFirstPlan()) {
      if (ranks_ready_) out = target_->plan();  // else a layer (of some rank) has not finished its profile
    } else if (target_->plannedAt() != 0 && target_->needsReplan()) {
      out = target_->plan("a step's measured peak went over its prediction");
    }
  }
  open(StepEventKey{StepEventKind::kBeforeLayers, -1}, peak);
  return out;
}

void StepDriver::forwardBegins(int64_t i, int64_t peak) {
  target_->layerCalled(i);
  open(StepEventKey{StepEventKind::kForward, i}, peak);
}

void StepDriver::forwardEnds(int64_t i, int64_t peak) {
  open(StepEventKey{i == layers_ - 1 ? StepEventKind::kAfterLayers : StepEventKind::kAfterLayer, i}, peak);
}

void StepDriver::backwardBegins(int64_t i, int64_t peak) { open(StepEventKey{StepEventKind::kBackward, i}, peak); }

void StepDriver::restBegins(int64_t peak) {
  if (rest_open_) return;
  rest_open_ = true;
  open(StepEventKey{StepEventKind::kRest, -1}, peak);
}

void StepDriver::seed(const std::string& record_json, const std::string& source) {
  TORCH_CHECK(target_->steps() == 0, "hpac memory target: a plan file seeds the first plan before the first step");
  target_->seed(readStepRecord(record_json, source).layers, source);
}

void StepDriver::optimizerBegins(int64_t peak, int64_t live) {
  restBegins(peak);
  optimizer_live_ = live;
}

std::vector<StepMessage> StepDriver::stepEnds(int64_t peak, int64_t fragmentation, int64_t live) {
  since_optimizer_ = 0;
  if (live >= 0 && optimizer_live_ >= 0) target_->optimizerGrew(live - optimizer_live_);
  optimizer_live_ = -1;
  return close(peak, fragmentation);  // the step's history row now; nothing counted until the next begins
}

bool StepDriver::checkpointed(int64_t i) const {
  TORCH_CHECK(i >= 0 && i < layers_, "hpac memory target: layer ", i, " of ", layers_);
  return target_->layerPlans()[i].checkpointed;
}

std::string StepDriver::state() const {
  std::ostringstream out;
  out << kStateFormat << "\nready " << (ranks_ready_ ? 1 : 0) << "\nmargin " << target_->margin() << "\n";
  for (const auto& [event, base] : target_->bases()) {
    out << "base " << stepEventKindToken(event.kind) << " " << event.index << " " << base << "\n";
  }
  char micros[40];
  for (const auto& layer : target_->candidates()) {
    out << "layer\n";
    for (const StepCandidate& c : layer) {
      std::snprintf(micros, sizeof(micros), "%.17g", c.recompute_micros);
      out << "candidate " << c.budget_bytes << " " << c.kept_bytes << " " << c.backward_bytes << " "
          << c.forward_bytes << " " << micros << " " << (c.checkpointed ? 1 : 0) << "\n";
    }
  }
  return out.str();
}

// Note [One step plan for every rank]
// Under FSDP2 (or any data-parallel job) every rank runs its own target. Each measures its own events (what a rank
// holds differs a little: its batch, its MoE routing) and profiles its own recompute times, so planning alone, the
// ranks could choose different plans, and replan at different steps. Planning instead from one problem for every
// rank — per event the largest base any rank measured, per candidate the largest bytes of any rank and rank 0's
// recompute time — gives every rank the same choice (the solver is deterministic), fitting the rank that holds the
// most; every later calibration takes the largest again, so the ranks replan together. Each rank applies the choice
// to its own regions (budget k/16 of its own off bytes). The front end exchanges state() at every step's start.
void StepDriver::merge(const std::vector<std::string>& states) {
  if (states.size() <= 1) return;
  std::vector<RankState> all;
  for (size_t r = 0; r < states.size(); ++r) all.push_back(readState(states[r], r));
  std::map<StepEventKey, int64_t> bases;
  int64_t margin = 0;
  bool ready = true;
  for (const RankState& s : all) {
    for (const auto& [event, base] : s.bases) {
      auto [it, fresh] = bases.emplace(event, base);
      if (!fresh) it->second = std::max(it->second, base);
    }
    margin = std::max(margin, s.margin);  // Note [Room after a step over the target]
    ready = ready && s.ready;
  }
  target_->setBases(std::move(bases));
  target_->setMargin(margin);
  ranks_ready_ = ready;
  if (!ready) return;
  std::vector<std::vector<StepCandidate>> mine = target_->candidates();
  for (const RankState& s : all) {
    bool same = s.candidates.size() == mine.size();
    for (size_t j = 0; same && j < mine.size(); ++j) same = s.candidates[j].size() == mine[j].size();
    if (!same) {
      error_ = "hpac: memory target: the ranks' layers have different candidate plans (" + candidateCounts(all) +
               "); every rank must run the same layers";
      return;
    }
  }
  for (size_t j = 0; j < mine.size(); ++j) {
    for (size_t k = 0; k < mine[j].size(); ++k) {
      StepCandidate& c = mine[j][k];
      c.recompute_micros = all[0].candidates[j][k].recompute_micros;
      for (const RankState& s : all) {
        c.kept_bytes = std::max(c.kept_bytes, s.candidates[j][k].kept_bytes);
        c.backward_bytes = std::max(c.backward_bytes, s.candidates[j][k].backward_bytes);
        c.forward_bytes = std::max(c.forward_bytes, s.candidates[j][k].forward_bytes);
      }
    }
  }
  target_->setCandidates(std::move(mine));
}

}  // namespace hpac
