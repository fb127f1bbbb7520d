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

enum class Mode { kOff, kFull, kSelective, kBudget };  // kBudget: policy/budget_policy.h, per region
const char* toString(Mode mode);
// Parses "off" | "full" | "selective" | "budget"; throws c10::Error naming the value and the allowed ones.
Mode parseMode(const std::string& text);

struct StepReport {
  Mode mode = Mode::kOff;
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
StepReport runStep(const std::vector<MoeBlock>& blocks, const at::Tensor& input, Mode mode, uint64_t seed);

// The comparison behind every parity verdict (demo, hpac-train --compare, the
// multi-rank workers, the tests): the largest absolute elementwise difference
// over matching tensor lists and where it is. Not comparable (counts, shapes or
// definedness differ) or non-finite (a NaN or an infinity on either side, even
// at the same place) is +infinity, so `max_abs` is never NaN and no tolerance
// accepts it.
struct TensorDiff {
  double max_abs = 0;
  // Empty when every pair is equal; otherwise the worst place, e.g.
  // "grad fc1.weight[3, 7]: 0.25 vs 0.5", "input[2]: nan vs 1 (not finite)",
  // or why the lists are not comparable.
  std::string where;
  bool within(double tolerance) const { return max_abs <= tolerance; }
  std::string describe() const;  // "max |diff| 0 " or "max |diff| 2.5e-07 at <where>"
};
// `names` labels the pairs in `where` (default: "tensor <i>").
TensorDiff compareTensors(const std::vector<at::Tensor>& a, const std::vector<at::Tensor>& b,
                          const std::vector<std::string>& names = {});
// compareTensors(a, b).max_abs.
double maxAbsDiff(const std::vector<at::Tensor>& a, const std::vector<at::Tensor>& b);
// |a - b| for scalars such as losses; +infinity when either is NaN or infinite.
double scalarDiff(double a, double b);

// The evidence table; `baseline` is the no-checkpoint report the gradient
// differences are measured against.
std::string formatEvidenceTable(const std::vector<StepReport>& reports, const StepReport& baseline);

}  // namespace hpac
