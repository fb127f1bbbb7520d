// hpac/tools/evidence/evidence.h
//
// One training step of a stack of MoeBlocks under a checkpoint mode, measured:
// loss, gradients, hpac's op counts, and tensor bytes from the
// TrackingAllocator. The demo prints these as the evidence table; tests use the
// same function to compare modes against a real no-checkpoint run.
#pragma once

#include "replay/checkpoint_mode.h"
#include "replay/invocation.h"
#include "tools/evidence/compare.h"
#include "tools/moe/moe_block.h"

#include <ATen/core/Tensor.h>

#include <string>
#include <vector>

namespace hpac {

struct StepReport {
  CheckpointMode mode = CheckpointMode::kOff;
  double loss = 0;
  InvocationStats stats;           // summed over the step's checkpoint invocations
  int64_t kept_after_forward = 0;  // tensor bytes alive after forward, minus those alive before it
  int64_t peak_over_baseline = 0;  // peak tensor bytes during the step, minus those alive before it
  std::vector<at::Tensor> grads;   // copies: input gradient, then every parameter's gradient
  std::vector<std::string> grad_names;  // "input", "block <b> parameter <i>": labels for compareTensors
};

// Runs forward (each block checkpointed in `mode`), loss = mean(out^2), and
// backward, with the CPU RNG seeded with `seed` first. Installs the
// TrackingAllocator. Parameter gradients are reset before the step.
StepReport runStep(const std::vector<MoeBlock>& blocks, const at::Tensor& input, CheckpointMode mode, uint64_t seed);

// The evidence table; `baseline` is the no-checkpoint report the gradient
// differences are measured against.
std::string formatEvidenceTable(const std::vector<StepReport>& reports, const StepReport& baseline);

}  // namespace hpac
