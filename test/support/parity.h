// GoogleTest face of compareTensors (tools/evidence/compare.h), the one comparison
// behind every parity test: NaN and infinity never match, and a failure names
// the tensor and the index of the worst difference.
//   EXPECT_TRUE(hpac::Matches(got, want));             // bit for bit
//   EXPECT_TRUE(hpac::Matches(got, want, 1e-5, names)) // within a tolerance
#pragma once

#include "tools/evidence/evidence.h"

#include <gtest/gtest.h>

#include <limits>
#include <string>
#include <vector>

namespace hpac {

inline ::testing::AssertionResult Matches(const std::vector<at::Tensor>& got, const std::vector<at::Tensor>& want,
                                          double tolerance = 0, const std::vector<std::string>& names = {}) {
  const TensorDiff d = compareTensors(got, want, names);
  if (d.within(tolerance)) return ::testing::AssertionSuccess() << d.describe();
  return ::testing::AssertionFailure() << d.describe() << " (tolerance " << tolerance << ")";
}

// Within `relative` x the largest |want| element; an all-zero or non-finite
// `want` never matches (a tolerance larger than the values compared would
// accept an all-zero result).
inline ::testing::AssertionResult MatchesScaled(const at::Tensor& got, const at::Tensor& want, double relative,
                                                const std::string& name) {
  const double scale = compareTensors({want}, {at::zeros_like(want)}).max_abs;
  if (!(scale > 0) || scale == std::numeric_limits<double>::infinity()) {
    return ::testing::AssertionFailure() << name << ": the reference is all zero or not finite (max |want| " << scale
                                         << ")";
  }
  return Matches({got}, {want}, relative * scale, {name});
}

// Scalars such as losses: NaN or infinity on either side never match.
inline ::testing::AssertionResult ScalarMatches(double got, double want, double tolerance = 0) {
  const double d = scalarDiff(got, want);
  if (d <= tolerance) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << got << " vs " << want << ": |diff| " << d << " (tolerance " << tolerance
                                       << ")";
}

// Sequences of scalars (loss curves): same length, and each pair matches as above.
inline ::testing::AssertionResult ScalarMatches(const std::vector<double>& got, const std::vector<double>& want,
                                                double tolerance = 0) {
  if (got.size() != want.size()) {
    return ::testing::AssertionFailure() << got.size() << " values vs " << want.size();
  }
  for (size_t i = 0; i < got.size(); ++i) {
    if (::testing::AssertionResult r = ScalarMatches(got[i], want[i], tolerance); !r) {
      return ::testing::AssertionFailure() << "at [" << i << "]: " << r.message();
    }
  }
  return ::testing::AssertionSuccess();
}

}  // namespace hpac
