// maxAbsDiff, the comparison behind every parity verdict of the demo, the
// trainer's --compare and the multi-rank workers: a NaN or an infinity on
// either side is never "equal", whatever the other values are.
#include "tools/evidence/compare.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

namespace hpac {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

TEST(Evidence, MaxAbsDiffOfEqualAndDifferentTensors) {
  const at::Tensor a = at::arange(6, at::kFloat).reshape({2, 3});
  EXPECT_EQ(maxAbsDiff({a, a}, {a.clone(), a.clone()}), 0.0);
  EXPECT_DOUBLE_EQ(maxAbsDiff({a}, {a + 0.5}), 0.5);
  EXPECT_EQ(maxAbsDiff({a}, {a, a}), kInf);               // counts differ
  EXPECT_EQ(maxAbsDiff({a}, {a.reshape({3, 2})}), kInf);  // shapes differ
  EXPECT_EQ(maxAbsDiff({a}, {at::Tensor()}), kInf);       // a gradient missing on one side
  EXPECT_EQ(maxAbsDiff({at::empty({0})}, {at::empty({0})}), 0.0);
}

TEST(Evidence, NanOrInfIsNeverEqual) {
  const at::Tensor ok = at::ones({4});
  at::Tensor nan = ok.clone();
  nan[2] = std::nan("");
  at::Tensor inf = ok.clone();
  inf[0] = kInf;
  // NaN on one side, on both sides at the same place, and behind a larger finite difference.
  EXPECT_EQ(maxAbsDiff({nan}, {ok}), kInf);
  EXPECT_EQ(maxAbsDiff({nan}, {nan.clone()}), kInf);
  EXPECT_EQ(maxAbsDiff({ok * 3, nan}, {ok, nan.clone()}), kInf);
  EXPECT_EQ(maxAbsDiff({ok}, {inf}), kInf);
  EXPECT_EQ(maxAbsDiff({inf}, {inf.clone()}), kInf);
  EXPECT_EQ(maxAbsDiff({nan.to(at::kBFloat16)}, {ok.to(at::kBFloat16)}), kInf);
}

}  // namespace
}  // namespace hpac
