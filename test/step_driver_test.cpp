// policy/step_driver.h: the events' kinds and order, the checks on how the model is called, and the ranks' merge.
#include "policy/step_driver.h"

#include <c10/util/Exception.h>
#include <gtest/gtest.h>

namespace hpac {
namespace {

std::unique_ptr<StepDriver> driver(int64_t layers) {
  std::vector<std::string> names;
  std::vector<std::shared_ptr<BudgetRegion>> regions;
  for (int64_t i = 0; i < layers; ++i) {
    names.push_back("layer " + std::to_string(i));
    regions.push_back(std::make_shared<BudgetRegion>(BudgetSpec{-1, 0}));
  }
  return std::make_unique<StepDriver>(std::make_unique<StepTarget>(int64_t{1} << 30, names, regions, 100, 100));
}

// One step of two layers, each event's peak its own number: what closes each event is the next call's peak.
void step(StepDriver& d, int64_t base) {
  d.stepBegins(0, base, 0);
  d.beforeLayers(0);
  d.forwardBegins(0, base + 1);  // closes "before the layers"
  d.forwardEnds(0, base + 2);    // closes "forward of layer 0"
  d.forwardBegins(1, base + 3);
  d.forwardEnds(1, base + 4);
  d.backwardBegins(1, base + 5);  // closes "after the layers"
  d.backwardBegins(0, base + 6);
  d.restBegins(base + 7);
  d.restBegins(base + 1000);  // the rest opens once a step: ignored
  d.stepEnds(base + 8, 0);
}

TEST(StepDriver, EventsAreKindsInTheStepsOrderNamedForPeople) {
  auto d = driver(2);
  step(*d, 0);
  ASSERT_EQ(d->target().history().size(), 1u);
  EXPECT_EQ(d->target().history().back().measured_bytes, 8);
  EXPECT_EQ(d->target().history().back().measured_event, "the rest");
  std::vector<std::string> names;
  for (const auto& [event, base] : d->target().bases()) names.push_back(event.name());
  // Ordered by (layers kept, own layer, kind): as the planner reads them.
  EXPECT_EQ(names, (std::vector<std::string>{"before the layers", "the rest", "backward of layer 0", "after layer 0",
                                             "forward of layer 0", "backward of layer 1", "after the layers",
                                             "forward of layer 1"}));
  StepEventKey rest{StepEventKind::kRest, -1};
  EXPECT_EQ(d->target().bases().at(rest), 8);  // "the rest" is absolute (Note [Profile, then absolute bases])
  EXPECT_EQ(d->target().bases().at(StepEventKey{StepEventKind::kForward, 1}), 4);
}

TEST(StepDriver, ASecondCallBeforeTheOptimizerIsAnError) {
  auto d = driver(1);
  d->watchOptimizer();
  d->stepBegins(0, 0, 0);
  EXPECT_TRUE(d->error().empty());
  d->stepBegins(0, 0, 0);
  EXPECT_NE(d->error().find("called again without optimizer.step()"), std::string::npos) << d->error();
}

TEST(StepDriver, RanksMergeTheLargestBasesAndMargins) {
  auto a = driver(2), b = driver(2);
  step(*a, 0);
  step(*b, 100);
  a->stepBegins(0, 0, 0);
  b->stepBegins(0, 0, 0);
  const std::vector<std::string> states = {a->state(), b->state()};
  a->merge(states);
  b->merge(states);
  EXPECT_EQ(a->target().bases(), b->target().bases());
  // Relative to the step's start in the profile step, but the rest (Note [Profile, then absolute bases]).
  EXPECT_EQ(a->target().bases().at(StepEventKey{StepEventKind::kRest, -1}), 108);
  EXPECT_EQ(a->target().bases().at(StepEventKey{StepEventKind::kForward, 1}), 4);
  EXPECT_THROW(a->merge({a->state(), "hpac-step-state 0\n"}), c10::Error);
}

}  // namespace
}  // namespace hpac
