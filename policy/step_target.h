// hpac/policy/step_target.h
//
// A whole-step memory target over a model's layers: the events' bases (Note
// [The step's peak as events], policy/step_plan.h), calibrated from every
// step, each layer's candidate plans from its BudgetRegion's profile, the
// choice of one per layer by planStep (Note [An exact step plan]), applied (a
// region's replan, or "not checkpointed"), and the messages and the history
// every front end reports. StepDriver (policy/step_driver.h) calls it in a
// step's order and owns the events; nothing else does.
// Note [Profile, then absolute bases]
// Step 1 runs every layer's region in its profile (everything recomputed, so
// no layer holds bytes of its own: each event's peak is its base). The
// optimizer's state appears at step 1's end, so those bases are kept relative
// to step 1's start and made absolute at the first plan, except "the rest"
// (the events with no layer kept after the backward: embedding backward,
// optimizer step), which already holds the state it creates. Absolute with
// the larger of step 2's start and step 1's start plus what the optimizer
// step grew by (its state; measured where the front end reports the optimizer
// step, StepDriver::optimizerBegins/stepEnds): step 2's start alone is short
// by whatever was alive at step 1's start and freed during it (a previous
// model's graph kept by a variable until step 1 rebinds it), and every event
// after the free would be predicted short by as much. Later steps' bases are
// their peaks less what the plan they ran keeps, and only ever rise.
// Not thread-safe: one training thread.
#pragma once

#include "policy/budget_policy.h"
#include "policy/byte_size.h"
#include "policy/step_plan.h"
#include "policy/step_record.h"

#include <algorithm>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

namespace hpac {

// The kinds of a step's events (Note [The step's peak as events]), in the order a step passes them; StepDriver
// (policy/step_driver.h) opens each at its boundary.
enum class StepEventKind : int8_t {
  kBeforeLayers,  // the model's forward up to the first layer (embedding)
  kForward,       // layer i's forward
  kAfterLayer,    // after layer i's forward, before the next one's
  kAfterLayers,   // after the last layer's forward: the norm, the logits, the loss and their backward
  kBackward,      // layer i's backward (its recompute and its gradients)
  kRest,          // after the layers' backward: embedding backward, optimizer step
};
// "before_layers", "forward", "after_layer", "after_layers", "backward", "rest": the kind's token (the ranks'
// state, Python's rank view); parseStepEventKind reads it back (false for another text).
const char* stepEventKindToken(StepEventKind kind);
bool parseStepEventKind(const std::string& token, StepEventKind* kind);

// One event of a step: its kind and, for a layer's, the layer (kAfterLayers: the last layer's index).
struct StepEventKey {
  StepEventKind kind = StepEventKind::kBeforeLayers;
  int64_t index = -1;
  // As stepEvent() (policy/step_plan.h) reads them: layers [0, layersKept()) hold their kept bytes, and ownLayer()'s
  // forward or backward bytes add (-1: no layer's). (i + 1, i) is the forward of layer i, (i, i) its backward.
  int64_t layersKept() const;
  int64_t ownLayer() const;
  // What people read: "forward of layer 2", "after layer 0", "after the layers", "backward of layer 0", "the rest".
  std::string name() const;
  bool operator<(const StepEventKey& o) const {
    return std::make_tuple(layersKept(), ownLayer(), kind) < std::make_tuple(o.layersKept(), o.ownLayer(), o.kind);
  }
  bool operator==(const StepEventKey& o) const { return kind == o.kind && index == o.index; }
};

// One candidate plan of one layer (what a LayerPlan becomes when it is chosen; policy/step_record.h).
struct StepCandidate {
  int64_t budget_bytes = 0;  // the region's budget (checkpointed), or off's bytes (not)
  int64_t kept_bytes = 0;
  int64_t backward_bytes = 0;
  double recompute_micros = 0;
  bool checkpointed = true;
  int64_t forward_bytes = 0;  // StepChoice::forward_bytes
};

struct StepMessage {
  bool warning = false;
  std::string text;
};

// Candidate budgets per checkpointed layer: k / kStepCandidateSteps of its off bytes.
constexpr int64_t kStepCandidateSteps = 16;
// The share of the target every plan keeps below it where a plan fits with it (Note [Room for a prediction]).
constexpr double kPredictionRoom = 0.005;
// Finished steps StepTarget::history() keeps.
constexpr size_t kStepHistory = 256;

class StepTarget {
 public:
  // regions[i]: layer i's budget region (its profile gives the candidates; replan applies a choice).
  // params_bytes / grads_bytes: named in the floor's error.
  StepTarget(int64_t target_bytes, std::vector<std::string> names, std::vector<std::shared_ptr<BudgetRegion>> regions,
             int64_t params_bytes, int64_t grads_bytes);

  int64_t targetBytes() const { return target_bytes_; }
  int64_t steps() const { return steps_; }
  int64_t plannedAt() const { return planned_at_; }
  bool stepOpen() const { return open_; }
  const std::string& error() const { return error_; }  // non-empty once the target fell below the floor

  // --- a step -------------------------------------------------------------------------------------------------
  void record(const StepEventKey& event, int64_t peak);
  // Layer i's forward started: the profile step checks that the layers run once each, in the order given (the
  // events' layers_kept counts assume it), and the target fails with error() otherwise.
  void layerCalled(int64_t i);
  std::vector<StepMessage> finishStep(int64_t fragmentation_bytes);
  void startStep(int64_t live_bytes);
  // What the open step's optimizer step grew the live bytes by (Note [Profile, then absolute bases]).
  void optimizerGrew(int64_t bytes) { grown_ = bytes; }

  // --- planning -----------------------------------------------------------------------------------------------
  bool wantsFirstPlan() const { return planned_at_ == 0 && steps_ >= 2; }
  bool regionsReady() const;
  void prepareFirstPlan();  // Note [Profile, then absolute bases]; the candidates
  // Plans (again, with `why` in the message when non-empty); on a target below the floor sets error() and applies
  // the floor's plan.
  std::vector<StepMessage> plan(const std::string& why = "");
  // Note [A plan file is a first plan]: the first plan is `layers` (a plan file's, matched by path) where this run's
  // measured step predicts it within the target less its room; otherwise the plan this run makes, with a warning.
  void seed(std::vector<LayerPlan> layers, std::string source);
  bool needsReplan() const;

  // --- what StepDriver reads and exchanges between ranks -------------------------------------------------------
  const std::map<StepEventKey, int64_t>& bases() const { return bases_; }
  void setBases(std::map<StepEventKey, int64_t> bases) { bases_ = std::move(bases); }
  // Note [Room after a step over the target] (step_target.cpp): the room later plans keep below the target.
  int64_t margin() const { return margin_; }
  void setMargin(int64_t margin) { margin_ = std::max<int64_t>(0, margin); }
  const std::vector<std::vector<StepCandidate>>& candidates() const { return candidates_; }
  void setCandidates(std::vector<std::vector<StepCandidate>> candidates);
  const std::vector<LayerPlan>& layerPlans() const { return plans_; }
  // The last kStepHistory finished steps (a long run keeps a bounded record).
  const std::deque<MeasuredStep>& history() const { return history_; }
  int64_t predictedBytes() const { return predicted_bytes_; }
  const std::string& predictedEvent() const { return predicted_event_; }
  // The prediction (peak, µs) for candidate k of every layer: what a user could set the same for every layer.
  std::vector<std::pair<int64_t, double>> uniformPlans() const;
  // The step record (policy/step_record.h): target, prediction, layers, events, history; and as JSON.
  StepRecord record() const;
  std::string reportJson() const { return stepRecordJson(record()); }

 private:
  int64_t held(const StepEventKey& event) const;
  std::pair<int64_t, std::string> predict() const;
  // The planner's problem: every layer's candidates and every event, in bases_' order.
  std::pair<std::vector<std::vector<StepChoice>>, std::vector<StepEvent>> problem() const;
  StepPlan solve() const;
  int64_t room() const;  // Note [Room for a prediction]
  // The seed's choice with its predicted peak (fits: within the target less room()); why: what kept it out.
  StepPlan seeded(std::string* why) const;
  void apply(const std::vector<int64_t>& choice);
  std::string floorError(int64_t floor, const std::string& what) const;

  const int64_t target_bytes_;
  std::vector<std::shared_ptr<BudgetRegion>> regions_;
  const int64_t params_bytes_, grads_bytes_;
  std::vector<LayerPlan> plans_;
  // Per layer, its forward's bytes in the profile step (Note [A forward, op by op]); 0 where not measured.
  std::vector<int64_t> profiled_forward_;
  std::vector<std::vector<StepCandidate>> candidates_;
  std::map<StepEventKey, int64_t> bases_;
  std::map<StepEventKey, int64_t> measured_;  // the open step's peaks
  std::vector<int64_t> called_;                // the open step's layer calls, in order
  bool open_ = false;
  int64_t steps_ = 0;
  int64_t start_bytes_ = 0;  // live bytes at the open (or last) step's start
  int64_t grown_ = -1;        // what the open step's optimizer step grew live bytes by (-1: not measured)
  int64_t last_start_ = 0;    // the previous step's start_bytes_ and grown_
  int64_t last_grown_ = -1;
  int64_t planned_at_ = 0;
  int64_t margin_ = 0;
  int64_t predicted_bytes_ = 0;
  std::string predicted_event_;
  std::deque<MeasuredStep> history_;
  std::string error_;
  std::vector<LayerPlan> seed_;  // Note [A plan file is a first plan]; emptied by the first plan
  std::string seed_source_;
};

}  // namespace hpac
