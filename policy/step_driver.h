// hpac/policy/step_driver.h
//
// Where the whole-step memory target lives: the one driver of a step's events
// for every front end (plugin/python/hpac/_target.py for Python and hpac.hf,
// tools/trainer/memory_target.cpp for hpac-train). The front ends place hooks
// at the step's boundaries, read their meter (hpac's tracking allocator, or
// CUDA's caching allocator) and pass its numbers here; they apply
// checkpointed(i). The driver owns the events' kinds and their order, the
// step's life (close, calibrate, plan, replan), the checks on how the model is
// called, and what ranks exchange to plan together (Note [One step plan for
// every rank]). StepTarget (policy/step_target.h) is what it drives.
//
// A step, as the hooks call it. `peak` is always the meter's peak since its
// last read: it closes the event open until then.
//   stepBegins(peak, live, fragmentation)   the model is called: the last step closes, this one starts
//   merge(every rank's state())            with several ranks, every rank, at every step
//   beforeLayers(peak)                      plans or replans as needed; opens "before the layers"
//   forwardBegins(i, peak) / forwardEnds(i, peak)   around layer i's forward
//   backwardBegins(i, peak)                 layer i's output gradient arrived
//   restBegins(peak)                        layer 0's input gradient arrived
//   optimizerBegins(peak, live)             the optimizer step starts (opens "the rest" if the gradient did not)
//   stepEnds(peak, fragmentation, live)     the optimizer step returned (optional: else the next stepBegins)
// error() is set, and nothing is planned, once the target cannot be met or the
// model is called in a way the events do not model; each front end raises it
// in its own language. Not thread-safe: one training thread.
#pragma once

#include "policy/step_target.h"

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace hpac {

class StepDriver {
 public:
  // measure_only: the events and history are kept, nothing is planned (every layer runs as the front end set it).
  explicit StepDriver(std::unique_ptr<StepTarget> target, bool measure_only = false);

  // --- the hooks' calls ---------------------------------------------------------------------------------------
  std::vector<StepMessage> stepBegins(int64_t peak, int64_t live, int64_t fragmentation);
  std::vector<StepMessage> beforeLayers(int64_t peak);
  void forwardBegins(int64_t i, int64_t peak);
  void forwardEnds(int64_t i, int64_t peak);
  void backwardBegins(int64_t i, int64_t peak);
  void restBegins(int64_t peak);  // once per step: a later call in the same step does nothing
  // live: the meter's live bytes as the optimizer step starts and as it returns; what it grew by (its state, made
  // at the first step) is what the first plan adds to the profile step's bases (Note [Profile, then absolute
  // bases]). -1: not measured.
  void optimizerBegins(int64_t peak, int64_t live);
  std::vector<StepMessage> stepEnds(int64_t peak, int64_t fragmentation, int64_t live = -1);
  // The optimizer's step ends every step (stepEnds): a second model call before it is gradient accumulation,
  // which the events do not model (error()).
  void watchOptimizer() { watching_ = true; }
  // A plan file's record (policy/step_record.h, its JSON text) as the first plan (Note [A plan file is a first
  // plan], step_target.cpp); source names it in messages. Before the first step.
  void seed(const std::string& record_json, const std::string& source);

  // --- several ranks (Note [One step plan for every rank]) -------------------------------------------------------
  // This rank's part of the plan's problem, as text that merge() reads ("hpac-step-state 1").
  std::string state() const;
  // Every rank's state() (this one's included), in rank order: per event the largest base, the largest margin, per
  // candidate the largest bytes and rank 0's time; whether every rank's regions are ready for the first plan.
  // Every rank calls it with the same states at the same step, so every rank plans the same.
  void merge(const std::vector<std::string>& states);

  // --- reading ------------------------------------------------------------------------------------------------
  const std::optional<StepEventKey>& openEvent() const { return open_; }
  bool checkpointed(int64_t i) const;
  const std::string& error() const { return error_.empty() ? target_->error() : error_; }
  const StepTarget& target() const { return *target_; }

 private:
  void open(std::optional<StepEventKey> next, int64_t peak);
  std::vector<StepMessage> close(int64_t peak, int64_t fragmentation);

  std::unique_ptr<StepTarget> target_;
  const bool measure_only_;
  const int64_t layers_;
  std::optional<StepEventKey> open_;
  bool rest_open_ = false;
  bool watching_ = false;
  int64_t since_optimizer_ = 0;  // model calls since the optimizer's last step
  int64_t optimizer_live_ = -1;  // live bytes as this step's optimizer step started (-1: not seen)
  bool ranks_ready_ = true;      // merge(): every rank's regions ready (one rank: its own)
  std::string error_;
};

}  // namespace hpac
