#include "tools/evidence/compare.h"

#include <ATen/ATen.h>

#include <cmath>
#include <limits>
#include <sstream>

namespace hpac {

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

}  // namespace hpac
