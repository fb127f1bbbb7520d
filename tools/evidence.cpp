#include "tools/evidence.h"

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

const char* toString(Mode mode) {
  switch (mode) {
    case Mode::kOff: return "off";
    case Mode::kFull: return "full";
    case Mode::kSelective: return "selective";
    case Mode::kBudget: return "budget";
  }
  return "?";
}

Mode parseMode(const std::string& text) {
  if (text == "off") return Mode::kOff;
  if (text == "full") return Mode::kFull;
  if (text == "selective") return Mode::kSelective;
  if (text == "budget") return Mode::kBudget;
  TORCH_CHECK(false, "unknown activation checkpoint mode '", text, "'; allowed: off, full, selective, budget");
}

StepReport runStep(const std::vector<MoeBlock>& blocks, const at::Tensor& input, Mode mode, uint64_t seed) {
  TORCH_CHECK(mode != Mode::kBudget, "hpac: runStep has no budget mode (a budget needs a BudgetRegion per block)");
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
      if (mode == Mode::kOff) {
        h = block.forward(h);
        continue;
      }
      CheckpointOptions options;
      if (mode == Mode::kSelective) options.policy = selectivePolicy();
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

namespace {

std::string formatIndex(const at::Tensor& t, int64_t flat) {
  std::string out = "[";
  std::vector<int64_t> index(t.dim());
  for (int64_t d = t.dim() - 1; d >= 0; --d) {
    index[d] = flat % t.size(d);
    flat /= t.size(d);
  }
  for (size_t d = 0; d < index.size(); ++d) out += (d ? ", " : "") + std::to_string(index[d]);
  return out + "]";
}

std::string valueAt(const at::Tensor& t, int64_t flat) {
  std::ostringstream out;
  out << t.reshape(-1)[flat].item<double>();
  return out.str();
}

}  // namespace

std::string TensorDiff::describe() const {
  std::ostringstream out;
  out << "max |diff| " << max_abs;
  if (!where.empty()) out << " at " << where;
  return out.str();
}

TensorDiff compareTensors(const std::vector<at::Tensor>& a, const std::vector<at::Tensor>& b,
                          const std::vector<std::string>& names) {
  constexpr double kInf = std::numeric_limits<double>::infinity();
  TensorDiff diff;
  if (a.size() != b.size()) {
    diff.max_abs = kInf;
    diff.where = "the lists hold " + std::to_string(a.size()) + " and " + std::to_string(b.size()) + " tensors";
    return diff;
  }
  for (size_t i = 0; i < a.size(); ++i) {
    const std::string name = i < names.size() && names.size() == a.size() ? names[i] : "tensor " + std::to_string(i);
    if (a[i].defined() != b[i].defined()) {
      diff.max_abs = kInf;
      diff.where = name + ": defined on one side only";
      return diff;
    }
    if (!a[i].defined()) continue;
    if (a[i].sizes() != b[i].sizes()) {
      std::ostringstream out;
      out << name << ": shapes " << a[i].sizes() << " vs " << b[i].sizes();
      diff.max_abs = kInf;
      diff.where = out.str();
      return diff;
    }
    if (a[i].numel() == 0) continue;
    // Compared in double: a bfloat16 or float difference is exact there.
    const at::Tensor x = a[i].detach().to(at::kDouble).reshape(-1), y = b[i].detach().to(at::kDouble).reshape(-1);
    // NaN and Inf are never "equal": a max() over a NaN difference would keep
    // the previous worst (std::max(worst, NaN) == worst) and print a false "OK".
    const at::Tensor bad = at::logical_not(at::isfinite(x)).logical_or_(at::logical_not(at::isfinite(y)));
    if (bad.any().item<bool>()) {
      const int64_t first = bad.nonzero()[0][0].item<int64_t>();
      diff.max_abs = kInf;
      diff.where = name + formatIndex(a[i], first) + ": " + valueAt(x, first) + " vs " + valueAt(y, first) + " (not finite)";
      return diff;
    }
    const at::Tensor d = (x - y).abs();
    const int64_t worst_at = d.argmax().item<int64_t>();
    const double worst = d[worst_at].item<double>();
    if (worst > diff.max_abs) {
      diff.max_abs = worst;
      diff.where = name + formatIndex(a[i], worst_at) + ": " + valueAt(x, worst_at) + " vs " + valueAt(y, worst_at);
    }
  }
  return diff;
}

double maxAbsDiff(const std::vector<at::Tensor>& a, const std::vector<at::Tensor>& b) {
  return compareTensors(a, b).max_abs;
}

double scalarDiff(double a, double b) {
  if (!std::isfinite(a) || !std::isfinite(b)) return std::numeric_limits<double>::infinity();
  return std::abs(a - b);
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
