// hpac/policy/step_plan.h
//
// The whole-step planner: given what each layer may keep (its candidate
// plans: bytes kept after its forward, bytes its backward adds, predicted
// recompute time) and the step's memory events (moments whose live bytes are
// a measured base plus what some layers keep), choose one candidate per layer
// so that every event stays under a byte target at the least recompute time.
// Plain C++: no dispatcher, no tensors; the front-ends measure the events
// (plugin/python/hpac/_target.py) and apply the answer.
//
// Note [The step's peak as events]
// A training step's live tensor bytes are the fixed bytes (parameters,
// gradients, optimizer state), the activations each layer keeps for its
// backward, and transients (the layer running now, the logits and the loss,
// one layer's recompute and its gradients in backward). What the layers keep
// is the only part a checkpointing plan changes, and it changes it additively:
// at a given moment of the step the layers [0, m) hold what their plans keep,
// the later ones hold nothing (not run yet in the forward; their backward done
// in the backward). So each moment is an event e = (base_e, m_e, layer_e):
//   live_e = base_e + sum_{j < m_e} kept_j + own_e
// where own_e is layer_e's forward_bytes in its forward, its backward_bytes in
// its backward, and 0 for an event of no layer;
// base_e is what the moment holds besides those layers' bytes,
// measured once under a reference plan by subtracting what that plan keeps.
// The events of one step, for L layers:
//   forward of layer i  (m = i, layer i: what it holds at its forward's
//                        highest moment under its plan, forward_bytes: Note
//                        [A forward, op by op] in policy/budget_policy.cpp;
//                        unmeasured, its kept bytes in full, an upper bound)
//   after the layers    (m = L: the norm, the logits, the loss and their
//                        backward, every layer's kept bytes)
//   backward of layer i (m = i, layer i: its recompute materialises what its
//                        backward reads, measured under the reference plan;
//                        a plan adds only what it keeps that the backward
//                        does not read, backward_bytes)
//   the rest            (m = 0: embedding backward, optimizer step)
// The predicted peak of a choice is the largest live_e; the event that sets
// it says which part of the step to shrink.
//
// Note [An exact step plan]
// Minimising the summed recompute time subject to every event <= target is a
// multiple-choice knapsack with nested (prefix) constraints. planStep solves
// it exactly by dynamic programming over the layers in order, keeping the
// Pareto front of (bytes kept by the layers so far, recompute time so far):
// a state is dropped only when another holds no more bytes at no more time,
// which never loses the optimum because every later constraint is monotone in
// the prefix bytes. The front is capped at kStepFrontCap states; past it the
// prefix bytes are rounded up to a grid (every plan still fits the target;
// StepPlan::exact says so). Held against a MILP (scipy's milp over the same
// choices) in test/python/test_step_plan.py.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace hpac {

// One candidate plan of one layer.
struct StepChoice {
  int64_t kept_bytes = 0;      // held from its forward until its backward
  int64_t backward_bytes = 0;  // added while its own backward runs (kept bytes the backward does not read)
  double recompute_micros = 0;  // predicted
  int64_t forward_bytes = 0;   // held at its own forward's highest moment (transients and what it has kept so far)
};

// One moment of the step (Note [The step's peak as events]).
struct StepEvent {
  int64_t base_bytes = 0;
  int64_t layers_kept = 0;  // layers [0, layers_kept) hold their kept bytes
  int64_t layer = -1;       // this layer's forward_bytes or backward_bytes add (then layers_kept == layer)
  bool forward = false;     // the forward of `layer` (else its backward)
};

// The front-ends' form of an event, (base, layers kept, layer): (i + 1, i) is the forward of layer i (layers
// [0, i) keep, layer i adds its forward bytes), (i, i) its backward, (m, -1) an event of no layer.
inline StepEvent stepEvent(int64_t base_bytes, int64_t layers_kept, int64_t layer) {
  const bool forward = layer >= 0 && layers_kept == layer + 1;
  return StepEvent{base_bytes, forward ? layer : layers_kept, layer, forward};
}

struct StepPlan {
  std::vector<int64_t> choice;  // per layer, an index into its candidates
  int64_t peak_bytes = 0;       // predicted
  int64_t peak_event = -1;      // the event that sets it
  double recompute_micros = 0;  // summed
  bool fits = false;            // peak_bytes <= target
  bool exact = true;            // Note [An exact step plan]: false when the front was rounded
  int64_t front_states = 0;     // the largest Pareto front the solver held
};

constexpr int64_t kStepFrontCap = 1 << 18;

// The predicted peak of `choice` (Note [The step's peak as events]); *event: the event setting it.
int64_t stepPeak(const std::vector<std::vector<StepChoice>>& layers, const std::vector<StepEvent>& events,
                 const std::vector<int64_t>& choice, int64_t* event = nullptr);

// The choice with every event <= target_bytes at the least summed micros (Note [An exact step plan]; of equal ones,
// the fewest bytes, then the earliest candidates); when none
// fits, the choice keeping the least bytes in every layer, with fits false. Throws c10::Error for a malformed
// problem (a layer without candidates, an event out of range), naming it.
StepPlan planStep(const std::vector<std::vector<StepChoice>>& layers, const std::vector<StepEvent>& events,
                  int64_t target_bytes);

}  // namespace hpac
