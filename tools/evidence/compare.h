// hpac/tools/evidence/compare.h
//
// The comparison behind every parity verdict in C++: the demo, hpac-train
// --compare, the multi-rank workers and the GoogleTest matchers
// (test/support/parity.h).
#pragma once

#include <ATen/core/Tensor.h>

#include <string>
#include <vector>

namespace hpac {

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

}  // namespace hpac
