// hpac/policy/step_record.h
//
// The whole step's record: one value for what a memory target reports
// (StepTarget::record, MemoryTarget.report() in Python), what `python -m hpac
// plan` writes as a plan file, and what hpac.hf.prepare applies from one
// (activation_checkpoint.plan). Written and read here, in C++, with the same
// names everywhere (docs/design.md, "One name per concept"); Python reads a
// plan file through torch.ops.hpac.read_step_record, never by itself.
//
// Note [The step record's format]
// JSON, one object. "format": "hpac-step-plan 2"; then what StepTarget knows
// (target_bytes, predicted_bytes, predicted_event, planned_at_step,
// margin_bytes, error, measured_bytes, measured_event, recompute_micros,
// layers, events, history); then the context the front end adds, kept as
// written (a plan's made_by, config, model, shapes, dtype, world_size, device,
// floor_bytes, fixed, messages, notes, modes; a run's measured_on). Read back,
// "hpac-step-plan 1" files (hpac 0.1's plans) are converted: memory_target_bytes
// is target_bytes, meta_measured_bytes / _event are measured_bytes / _event;
// any other format is refused by name. recompute_micros is derived (the
// checkpointed layers' sum) and written, never read.
#pragma once

#include "policy/json_value.h"

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace hpac {

constexpr const char* kStepRecordFormat = "hpac-step-plan 2";

// One layer's part of the plan: not checkpointed (off's bytes), or its budget region's budget and what that keeps.
struct LayerPlan {
  std::string path;
  bool checkpointed = true;
  int64_t budget_bytes = 0;    // the region's budget (checkpointed)
  int64_t kept_bytes = 0;      // held from its forward until its backward
  int64_t forward_bytes = 0;   // held at its forward's highest moment (Note [A forward, op by op])
  int64_t backward_bytes = 0;  // added while its backward runs: kept bytes the backward does not read
  int64_t off_bytes = 0;       // what it keeps not checkpointed
  double recompute_micros = 0;
  JsonValue ops;               // the front end's op counts ({"saved", "recomputed", "served"}), or null
};

// One finished step of a run: its measured peak and what set it, and, once planned, the prediction.
struct MeasuredStep {
  int64_t step = 0;
  int64_t measured_bytes = 0;  // the step's largest event (fragmentation not included)
  std::string measured_event;
  bool planned = false;
  int64_t predicted_bytes = 0;
  std::string predicted_event;
  int64_t fragmentation_bytes = 0;
};

struct StepRecord {
  int64_t target_bytes = 0;
  int64_t predicted_bytes = 0;
  std::string predicted_event;
  int64_t planned_at_step = 0;
  int64_t margin_bytes = 0;   // Note [Room after a step over the target]
  std::string error;          // the floor's message, when the target is below it
  int64_t measured_bytes = -1;  // the last step measured (-1: none; null in JSON)
  std::string measured_event;
  std::vector<LayerPlan> layers;
  std::vector<std::pair<std::string, int64_t>> events;  // each event's base, in the planner's order
  std::vector<MeasuredStep> history;
  std::vector<std::pair<std::string, JsonValue>> context;  // the front end's keys, in order

  double recomputeMicros() const;  // the checkpointed layers' sum
  const LayerPlan* layer(const std::string& path) const;
};

// Note [The step record's format].
std::string stepRecordJson(const StepRecord& record);
// Note [The step record's format]; throws c10::Error naming `source`, the key and what is allowed.
StepRecord readStepRecord(const std::string& text, const std::string& source);

}  // namespace hpac
