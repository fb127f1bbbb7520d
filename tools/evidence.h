// hpac/tools/evidence.h
//
// One training step of a stack of MoeBlocks under a checkpoint mode, measured:
// loss, gradients, hpac's op counts, and tensor bytes from the
// TrackingAllocator. The demo prints these as the evidence table; tests use the
// same function to compare modes against a real no-checkpoint run.
#pragma once

#include "replay/invocation.h"
#include "tools/moe_block.h"

#include <ATen/core/Tensor.h>

#include <string>
#include <vector>

namespace hpac {

enum class Mode { kOff, kFull, kSelective };
const char* toString(Mode mode);
// Parses "off" | "full" | "selective"; throws c10::Error naming the value and the allowed ones.
Mode parseMode(const std::string& text);

struct StepReport {
  Mode mode = Mode::kOff;
  double loss = 0;
  InvocationStats stats;           // summed over the step's checkpoint invocations
  int64_t kept_after_forward = 0;  // tensor bytes alive after forward, minus those alive before it
  int64_t peak_over_baseline = 0;  // peak tensor bytes during the step, minus those alive before it
  std::vector<at::Tensor> grads;   // copies: input gradient, then every parameter's gradient
};

// Runs forward (each block checkpointed in `mode`), loss = mean(out^2), and
// backward, with the CPU RNG seeded with `seed` first. Installs the
// TrackingAllocator. Parameter gradients are reset before the step.
StepReport runStep(const std::vector<MoeBlock>& blocks, const at::Tensor& input, Mode mode, uint64_t seed);

// Largest absolute elementwise difference over matching tensor lists
// (infinity if shapes or counts differ, one side lacks a gradient, or either
// side holds a NaN or an infinity: a non-finite value is never equal).
double maxAbsDiff(const std::vector<at::Tensor>& a, const std::vector<at::Tensor>& b);

// The evidence table; `baseline` is the no-checkpoint report the gradient
// differences are measured against.
std::string formatEvidenceTable(const std::vector<StepReport>& reports, const StepReport& baseline);

}  // namespace hpac
