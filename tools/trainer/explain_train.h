// hpac/tools/trainer/explain_train.h
//
// hpac-train --explain: one training step of the config's model per mode
// (off, full, selective), each with its memory timeline captured, and in the
// explained mode the first checkpoint region of the first wrapped layer
// recorded op by op (replay/explain.h). docs/explain.md.
#pragma once

#include "replay/explain.h"
#include "tools/trainer/config.h"
#include "tools/trainer/registry.h"

#include "absl/status/statusor.h"

namespace hpac::trainer {

// `explained`: full or selective (off checkpoints nothing: InvalidArgument
// naming it). Single-process float32 configs only (the tracking allocator
// cannot serve bfloat16's oneDNN buffers).
absl::StatusOr<ExplainReport> explainTraining(const TrainConfig& config, const ModelRegistry& registry,
                                              CheckpointMode explained);

}  // namespace hpac::trainer
