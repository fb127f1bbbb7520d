// The whole-step planner (policy/step_plan.h) on cases small enough to solve by hand, and against brute force.
#include "policy/step_plan.h"

#include <gtest/gtest.h>

#include <limits>
#include <random>

namespace hpac {
namespace {

using Layers = std::vector<std::vector<StepChoice>>;

// A candidate whose forward holds its kept bytes at its highest moment (nothing transient).
StepChoice choice(int64_t kept, int64_t backward, double micros) { return {kept, backward, micros, kept}; }

// Every layer: keep everything (100 bytes, 0 µs), half (50 bytes, 3 µs), nothing (0 bytes, 10 µs).
Layers threeLayers() {
  const std::vector<StepChoice> c = {choice(100, 0, 0), choice(50, 0, 3), choice(0, 0, 10)};
  return {c, c, c};
}

// Note [The step's peak as events]: a forward event per layer, the head after them, a backward event per layer.
std::vector<StepEvent> events(int64_t n, int64_t fixed, int64_t head, int64_t recompute) {
  std::vector<StepEvent> e;
  for (int64_t i = 0; i < n; ++i) e.push_back({fixed, i, i, true});
  e.push_back({fixed + head, n, -1});
  for (int64_t i = 0; i < n; ++i) e.push_back({fixed + recompute, i, i});
  return e;
}

TEST(StepPlan, KeepsEverythingWhenTheTargetAllowsIt) {
  const StepPlan p = planStep(threeLayers(), events(3, 1000, 20, 100), 1320);
  EXPECT_TRUE(p.fits);
  EXPECT_EQ(p.choice, (std::vector<int64_t>{0, 0, 0}));
  EXPECT_EQ(p.peak_bytes, 1320);  // the head: fixed + head + 3 x 100
  EXPECT_EQ(p.peak_event, 3);
  EXPECT_EQ(p.recompute_micros, 0);
}

// 1000 + 20 + kept <= 1220: 200 bytes among three layers. Two halves and one whole (200 bytes, 6 µs) beat one whole
// and two nothing (100 bytes, 20 µs) and every other mix; the solver must find 6 µs.
TEST(StepPlan, FindsTheCheapestMixUnderTheTarget) {
  const StepPlan p = planStep(threeLayers(), events(3, 1000, 20, 100), 1220);
  EXPECT_TRUE(p.fits);
  EXPECT_DOUBLE_EQ(p.recompute_micros, 6);
  EXPECT_EQ(p.peak_bytes, 1220);
  EXPECT_TRUE(p.exact);
}

// The backward of layer i holds the kept bytes of the layers before it and its own recompute (500 here), never its
// own kept bytes: a layer's kept bytes meet the recompute of every later layer. So the last layer is the one to keep
// whole (it meets no later recompute), and the first two are recomputed.
TEST(StepPlan, TheLastLayersKeptBytesDoNotMeetItsOwnRecompute) {
  const StepPlan p = planStep(threeLayers(), events(3, 1000, 0, 500), 1500);
  EXPECT_TRUE(p.fits);
  EXPECT_EQ(p.choice, (std::vector<int64_t>{2, 2, 0}));
  EXPECT_DOUBLE_EQ(p.recompute_micros, 20);
}

TEST(StepPlan, BackwardBytesCountOnlyInTheirOwnBackward) {
  Layers layers = {{choice(100, 0, 0), choice(0, 0, 10)}, {choice(100, 400, 0), choice(0, 0, 10)}};
  // Layer 1 keeping 100 bytes adds 400 while its backward runs (1000 + 100 + 400 with layer 0 whole): over 1300.
  const StepPlan p = planStep(layers, events(2, 1000, 0, 0), 1300);
  EXPECT_TRUE(p.fits);
  EXPECT_EQ(p.choice, (std::vector<int64_t>{0, 1}));
}

// Note [A forward, op by op]: a layer's forward holds its own forward_bytes (its transients and what it has kept so
// far), beside what the layers before it keep, never its kept bytes as such. Layer 1 unwrapped keeps 100 bytes but
// peaks at 300 part-way through its forward (a transient before most of what it keeps exists); checkpointed it keeps
// nothing and peaks at 250. With layer 0 keeping 100: 1000 + 100 + 300 is over 1380, 1000 + 100 + 250 is not; the
// head (1000 + 100 + 100 unwrapped) fits either way. A planner counting kept bytes in the forward would keep layer 1.
TEST(StepPlan, ForwardBytesCountInTheirOwnForward) {
  Layers layers = {{choice(100, 0, 0)}, {StepChoice{100, 0, 0, 300}, StepChoice{0, 0, 10, 250}}};
  StepPlan p = planStep(layers, events(2, 1000, 0, 0), 1380);
  EXPECT_TRUE(p.fits);
  EXPECT_EQ(p.choice, (std::vector<int64_t>{0, 1}));
  EXPECT_EQ(p.peak_bytes, 1350);  // the forward of layer 1
  EXPECT_EQ(p.peak_event, 1);
  p = planStep(layers, events(2, 1000, 0, 0), 1400);
  EXPECT_EQ(p.choice, (std::vector<int64_t>{0, 0}));
  EXPECT_EQ(p.peak_bytes, 1400);
}

TEST(StepPlan, NothingFitsGivesTheFloorAndSaysSo) {
  const StepPlan p = planStep(threeLayers(), events(3, 1000, 20, 100), 1010);
  EXPECT_FALSE(p.fits);
  EXPECT_EQ(p.choice, (std::vector<int64_t>{2, 2, 2}));
  EXPECT_EQ(p.peak_bytes, 1100);  // fixed + one layer's recompute
  EXPECT_EQ(p.peak_event, 4);     // the backward of layer 0
}

TEST(StepPlan, MalformedProblemsNameWhatIsWrong) {
  EXPECT_THROW(planStep({{}}, {}, 10), c10::Error);
  EXPECT_THROW(planStep(threeLayers(), {{0, 4, -1}}, 10), c10::Error);
  EXPECT_THROW(planStep(threeLayers(), {{0, 0, 1}}, 10), c10::Error);  // layer 1's backward must count layer 0
  EXPECT_THROW(planStep(threeLayers(), {{0, 2, 1, true}}, 10), c10::Error);  // its forward too, not itself
  EXPECT_THROW(planStep({{StepChoice{0, 0, 0, -1}}}, {}, 10), c10::Error);
}

// Against every choice, on random problems: the solver's time is the least among those that fit.
TEST(StepPlan, MatchesBruteForce) {
  std::mt19937 rng(7);
  std::uniform_int_distribution<int64_t> bytes(0, 400);
  std::uniform_real_distribution<double> micros(0, 50);
  for (int round = 0; round < 200; ++round) {
    const int64_t n = 1 + round % 5, k = 1 + round % 4;
    Layers layers(n);
    for (auto& cands : layers) {
      for (int64_t c = 0; c < k; ++c) cands.push_back({bytes(rng), bytes(rng) / 4, micros(rng), bytes(rng)});
    }
    const std::vector<StepEvent> ev = events(n, 1000, bytes(rng), bytes(rng));
    const int64_t target = 1000 + bytes(rng) * n / 2;
    double best = std::numeric_limits<double>::infinity();
    std::vector<int64_t> choice(n, 0);
    for (;;) {
      if (stepPeak(layers, ev, choice) <= target) {
        double t = 0;
        for (int64_t j = 0; j < n; ++j) t += layers[j][choice[j]].recompute_micros;
        best = std::min(best, t);
      }
      int64_t j = 0;
      while (j < n && ++choice[j] == k) choice[j++] = 0;
      if (j == n) break;
    }
    const StepPlan p = planStep(layers, ev, target);
    ASSERT_EQ(p.fits, best < std::numeric_limits<double>::infinity()) << "round " << round;
    if (p.fits) {
      EXPECT_NEAR(p.recompute_micros, best, 1e-9) << "round " << round;
      EXPECT_LE(p.peak_bytes, target);
    }
  }
}

}  // namespace
}  // namespace hpac
