#include "tools/evidence/evidence.h"

#include "policy/selective_policy.h"
#include "replay/checkpoint.h"
#include "replay/tracking_allocator.h"

#include <ATen/ATen.h>

#include <cmath>
#include <iomanip>
#include <limits>
#include <memory>
#include <sstream>

namespace hpac {

StepReport runStep(const std::vector<MoeBlock>& blocks, const at::Tensor& input, CheckpointMode mode, uint64_t seed) {
  TORCH_CHECK(mode != CheckpointMode::kBudget, "hpac: runStep has no budget mode (a budget needs a BudgetRegion per block)");
  TrackingAllocator& tracker = TrackingAllocator::install();
  for (const MoeBlock& b : blocks) {
    for (at::Tensor p : b.parameters()) {
      if (p.grad().defined()) p.mutable_grad().reset();
    }
  }
  at::Tensor x = input.detach().clone().set_requires_grad(true);
  at::manual_seed(seed);

  StepReport report;
  report.mode = mode;
  std::vector<std::shared_ptr<InvocationStats>> stats;
  const int64_t before = tracker.currentBytes();
  tracker.resetPeak();
  {
    at::Tensor h = x;
    for (const MoeBlock& block : blocks) {
      if (mode == CheckpointMode::kOff) {
        h = block.forward(h);
        continue;
      }
      CheckpointOptions options = checkpointOptionsFor(mode);
      options.stats_out = stats.emplace_back(std::make_shared<InvocationStats>());
      h = checkpoint([&block](const at::Tensor& in) { return block.forward(in); }, h, options);
    }
    at::Tensor loss = h.pow(2).mean();
    report.kept_after_forward = tracker.currentBytes() - before;
    report.loss = loss.item<double>();
    loss.backward();
  }
  report.peak_over_baseline = tracker.peakBytes() - before;
  for (const auto& s : stats) report.stats += *s;
  // Copies: later backward passes accumulate into the parameters' .grad in place.
  auto copy = [](const at::Tensor& g) { return g.defined() ? g.clone() : g; };
  report.grads.push_back(copy(x.grad()));
  report.grad_names.push_back("input");
  for (size_t b = 0; b < blocks.size(); ++b) {
    size_t i = 0;
    for (const at::Tensor& p : blocks[b].parameters()) {
      report.grads.push_back(copy(p.grad()));
      report.grad_names.push_back("block " + std::to_string(b) + " parameter " + std::to_string(i++));
    }
  }
  return report;
}


std::string formatEvidenceTable(const std::vector<StepReport>& reports, const StepReport& baseline) {
  std::ostringstream out;
  auto mib = [](int64_t bytes) { return static_cast<double>(bytes) / (1024.0 * 1024.0); };
  out << std::left << std::setw(10) << "mode" << std::right << std::setw(9) << "ops fwd" << std::setw(11)
      << "ops recomp" << std::setw(7) << "saved" << std::setw(11) << "saved MiB" << std::setw(8) << "served"
      << std::setw(11) << "recomputed" << std::setw(14) << "kept fwd MiB" << std::setw(10) << "peak MiB"
      << std::setw(14) << "loss" << std::setw(14) << "max |dgrad|" << "\n";
  for (const StepReport& r : reports) {
    out << std::left << std::setw(10) << toString(r.mode) << std::right << std::setw(9) << r.stats.ops_forward
        << std::setw(11) << r.stats.ops_recompute << std::setw(7) << r.stats.saved << std::setw(11)
        << std::fixed << std::setprecision(3) << mib(r.stats.saved_bytes) << std::setw(8) << r.stats.served
        << std::setw(11) << r.stats.recomputed << std::setw(14) << mib(r.kept_after_forward) << std::setw(10)
        << mib(r.peak_over_baseline) << std::setw(14) << std::setprecision(8) << r.loss << std::setw(14)
        << std::scientific << std::setprecision(2) << maxAbsDiff(r.grads, baseline.grads) << std::defaultfloat
        << "\n";
  }
  return out.str();
}

}  // namespace hpac
