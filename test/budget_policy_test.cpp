// The budget policy (policy/budget_policy.h) through hpac::checkpoint: profile,
// plan, replay; parity with no checkpointing under every budget; plans that
// stop matching the region; bad specs.
#include "policy/budget_policy.h"
#include "replay/checkpoint.h"
#include "replay/tracking_allocator.h"
#include "test/support/captured_warnings.h"
#include "test/support/error_message.h"
#include "test/support/parity.h"
#include "tools/evidence/evidence.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/library.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <functional>
#include <random>
#include <thread>

namespace hpac {
namespace {

struct Problem {
  at::Tensor x, w1, w2, w3;
  std::vector<at::Tensor> params() const { return {x, w1, w2, w3}; }
};

Problem problem() {
  at::manual_seed(21);
  return Problem{at::randn({16, 32}).set_requires_grad(true), at::randn({32, 64}).set_requires_grad(true),
                 at::randn({64, 64}).set_requires_grad(true), at::randn({64, 32}).set_requires_grad(true)};
}

// `extra` more tanh(mm) rounds change the op sequence (a region whose ops vary between steps).
at::Tensor body(const Problem& p, const at::Tensor& x, int extra = 0) {
  at::Tensor h = at::gelu(at::mm(x, p.w1));
  h = at::tanh(at::mm(h, p.w2)) * at::sigmoid(h);
  for (int i = 0; i < extra; ++i) h = at::tanh(at::mm(h, p.w2));
  return at::softmax(at::mm(h, p.w3), -1);
}

struct Step {
  std::vector<at::Tensor> grads;
  InvocationStats stats;
};

Step step(const Problem& p, const PolicyFactory& policy, bool checkpointed, int extra = 0) {
  auto stats = std::make_shared<InvocationStats>();
  CheckpointOptions o;
  o.policy = policy;
  o.stats_out = stats;
  o.early_stop = false;  // these tests count every op of the recompute (Note [The recompute stops early])
  at::Tensor y = checkpointed ? checkpoint([&](const at::Tensor& in) { return body(p, in, extra); }, p.x, o)
                              : body(p, p.x, extra);
  Step s{torch::autograd::grad({(y * y).sum()}, p.params()), {}};
  y = at::Tensor();
  s.stats = *stats;
  return s;
}

TEST(BudgetPolicy, ProfilesOnceThenReplaysThePlanWithGradientsEqualToOff) {
  const Problem p = problem();
  const Step off = step(p, {}, false);
  for (double fraction : {0.0, 0.1, 0.25, 0.5, 0.75, 1.0}) {
    auto region = std::make_shared<BudgetRegion>(BudgetSpec{fraction, -1});
    const Step profile = step(p, region->factory(), true);
    EXPECT_EQ(profile.stats.saved, 0) << "the profile runs as full";
    EXPECT_EQ(maxAbsDiff(profile.grads, off.grads), 0.0) << fraction;
    const BudgetRegion::Status st = region->status();
    ASSERT_EQ(st.stage, BudgetRegion::Stage::kPlanned) << fraction;
    EXPECT_EQ(static_cast<int64_t>(st.profile.size()), profile.stats.ops_forward);
    EXPECT_LE(st.plan.kept_bytes, st.plan.budget_bytes);
    ASSERT_GT(st.plan.off_bytes, 0) << "hpac::checkpoint's saved-tensor hook reports what autograd saves";
    EXPECT_LT(st.plan.off_bytes, st.plan.total_bytes);
    EXPECT_EQ(st.plan.budget_bytes, static_cast<int64_t>(fraction * static_cast<double>(st.plan.off_bytes)));
    int64_t planned = 0;
    for (bool s : st.plan.save) planned += s;
    for (int i = 0; i < 2; ++i) {
      const Step replay = step(p, region->factory(), true);
      EXPECT_EQ(maxAbsDiff(replay.grads, off.grads), 0.0) << fraction;
      EXPECT_EQ(replay.stats.saved, planned) << fraction;
      // Note [Frames hold what needs no recompute]: a plan that covers what off keeps is never recomputed.
      EXPECT_EQ(replay.stats.served, fraction == 1.0 ? 0 : planned) << fraction;
      EXPECT_EQ(replay.stats.recomputes, fraction == 1.0 ? 0 : 1) << fraction;
      EXPECT_EQ(replay.stats.unserved, 0);
    }
    if (fraction == 0.0) {
      EXPECT_EQ(planned, 0);
    }
    if (fraction == 1.0) {
      EXPECT_GT(planned, 0);
    }
    EXPECT_EQ(region->status().stage, BudgetRegion::Stage::kPlanned);
  }
}

// tanh(relu(x @ w1) @ w2).sum() with 16 x 64 fp32 activations, counted by hand in the tests below.
struct Chain {
  bool seeded = (at::manual_seed(3), true);  // first member: seeds before the tensors below are drawn
  at::Tensor x = at::randn({16, 32}).set_requires_grad(true);
  at::Tensor w1 = at::randn({32, 64}).set_requires_grad(true);
  at::Tensor w2 = at::randn({64, 64}).set_requires_grad(true);
  at::Tensor operator()(const at::Tensor& in) const { return at::tanh(at::mm(at::relu(at::mm(in, w1)), w2)).sum(); }
};

// Note [What off keeps]: 1.0 is the bytes of the outputs autograd saves, counted by hand here: relu and tanh
// save their results (16 x 64 fp32 each); the matmuls save their operands, which are the region's input, the
// weights and relu's result (already counted); sum saves no tensor.
TEST(BudgetPolicy, OneIsWhatCheckpointingOffKeeps) {
  const Chain c;
  const at::Tensor &x = c.x, &w1 = c.w1, &w2 = c.w2;
  auto fn = [&](const at::Tensor& in) { return c(in); };
  auto region = std::make_shared<BudgetRegion>(BudgetSpec{1.0, -1});
  for (int i = 0; i < 2; ++i) {
    CheckpointOptions o;
    o.policy = region->factory();
    torch::autograd::grad({checkpoint(fn, x, o)}, {x, w1, w2});
  }
  const BudgetRegion::Status st = region->status();
  ASSERT_EQ(st.stage, BudgetRegion::Stage::kPlanned);
  constexpr int64_t kActivation = 16 * 64 * 4;
  EXPECT_EQ(st.plan.off_bytes, 2 * kActivation);
  EXPECT_EQ(st.plan.total_bytes, 4 * kActivation + 4);  // both mm results, relu, tanh, the sum's scalar
  EXPECT_EQ(st.plan.budget_bytes, 2 * kActivation);
  EXPECT_LE(st.plan.kept_bytes, 2 * kActivation);
}

// Note [Dead ops are skipped], counted by hand: at 1.0 the plan keeps what autograd saves (relu's and tanh's
// results), so nothing the backward needs depends on the two matmuls or the sum: the recompute serves 2 ops,
// skips 3, runs none.
TEST(BudgetPolicy, OpsNothingBackwardNeedsAreSkippedInTheRecompute) {
  const Chain c;
  const at::Tensor &x = c.x, &w1 = c.w1, &w2 = c.w2;
  auto fn = [&](const at::Tensor& in) { return c(in); };
  const auto off = torch::autograd::grad({fn(x)}, {x, w1, w2});
  auto region = std::make_shared<BudgetRegion>(BudgetSpec{1.0, -1});
  for (int i = 0; i < 3; ++i) {
    auto stats = std::make_shared<InvocationStats>();
    CheckpointOptions o;
    o.policy = region->factory();
    o.stats_out = stats;
    o.hold_saved = false;  // the recompute runs (as under torch.utils.checkpoint): Note [Frames hold what needs no recompute]
    o.early_stop = false;  // to its end: this test counts every skipped op
    EXPECT_TRUE(Matches(torch::autograd::grad({checkpoint(fn, x, o)}, {x, w1, w2}), off)) << i;
    if (i == 0) continue;  // the profile
    EXPECT_EQ(stats->served, 2) << i;
    EXPECT_EQ(stats->skipped, 3) << i;
    EXPECT_EQ(stats->recomputed, 0) << i;
  }
  const BudgetPlan plan = region->status().plan;
  EXPECT_EQ(std::count(plan.skip.begin(), plan.skip.end(), true), 3);
}

// Note [Skips are verified]: a forward with the plan's op sequence whose tensors flow otherwise (here the last
// mul reads the second matmul's result, which the profiled forward did not) runs every op in its recompute.
TEST(BudgetPolicy, ASkipThatAForwardContradictsIsNotTaken) {
  at::manual_seed(3);
  const at::Tensor x = at::randn({16, 32}).set_requires_grad(true);
  const at::Tensor w1 = at::randn({32, 64}).set_requires_grad(true);
  const at::Tensor w2 = at::randn({64, 64}).set_requires_grad(true);
  auto fn = [&](const at::Tensor& in, bool rewired) {
    const at::Tensor c = at::mm(at::relu(at::mm(in, w1)), w2);
    const at::Tensor d = at::tanh(c);
    return at::mul(d, rewired ? c : d).sum();
  };
  auto region = std::make_shared<BudgetRegion>(BudgetSpec{1.0, -1});
  for (bool rewired : {false, false, true, false}) {
    auto stats = std::make_shared<InvocationStats>();
    CheckpointOptions o;
    o.policy = region->factory();
    o.stats_out = stats;
    auto body = [&](const at::Tensor& in) { return fn(in, rewired); };
    const auto got = torch::autograd::grad({checkpoint(body, x, o)}, {x, w1, w2});
    EXPECT_TRUE(Matches(got, torch::autograd::grad({fn(x, rewired)}, {x, w1, w2}))) << rewired;
    if (rewired) {
      EXPECT_EQ(stats->skipped, 0);
    }
  }
  ASSERT_EQ(region->status().stage, BudgetRegion::Stage::kPlanned);
  const std::vector<bool> skip = region->status().plan.skip;
  EXPECT_GT(std::count(skip.begin(), skip.end(), true), 0);
}

TEST(BudgetPolicy, MoreBudgetNeverKeepsLessOrRecomputesMore) {
  const Problem p = problem();
  double last_saved_micros = -1;
  int64_t last_kept = -1;
  auto region = std::make_shared<BudgetRegion>(BudgetSpec{1.0, -1});
  step(p, region->factory(), true);
  const std::vector<ProfiledOp> profile = region->status().profile;
  const int64_t total = totalOutputBytes(profile);
  for (int k = 0; k <= 10; ++k) {
    const BudgetPlan plan = planBudget(profile, total * k / 10);
    EXPECT_GE(plan.saved_micros, last_saved_micros);
    EXPECT_LE(plan.kept_bytes, plan.budget_bytes);
    last_saved_micros = plan.saved_micros;
    last_kept = plan.kept_bytes;
  }
  EXPECT_EQ(last_kept, total);
}

// Note [Plans that stay valid]: a forward with another op sequence uses the
// fixed policy from the first differing op, the region profiles again, and
// after max_replans it stays on the fixed policy with one warning.
TEST(BudgetPolicy, ARegionWhoseOpsChangeReprofilesThenFallsBack) {
  const Problem p = problem();
  auto region = std::make_shared<BudgetRegion>(BudgetSpec{0.5, -1, /*profile_invocations=*/1, /*max_replans=*/1});
  step(p, region->factory(), true, 0);  // profile
  ASSERT_EQ(region->status().stage, BudgetRegion::Stage::kPlanned);
  const Step changed = step(p, region->factory(), true, 1);
  EXPECT_EQ(maxAbsDiff(changed.grads, step(p, {}, false, 1).grads), 0.0);
  EXPECT_EQ(region->status().stage, BudgetRegion::Stage::kProfiling);
  EXPECT_EQ(region->status().replans, 1);
  step(p, region->factory(), true, 1);  // profiles the new sequence
  ASSERT_EQ(region->status().stage, BudgetRegion::Stage::kPlanned);
  const Step again = step(p, region->factory(), true, 2);  // differs again: no replans left
  EXPECT_EQ(maxAbsDiff(again.grads, step(p, {}, false, 2).grads), 0.0);
  EXPECT_EQ(region->status().stage, BudgetRegion::Stage::kFallback);
  const Step fixed = step(p, region->factory(), true, 0);
  EXPECT_EQ(maxAbsDiff(fixed.grads, step(p, {}, false, 0).grads), 0.0);
  EXPECT_GT(fixed.stats.saved, 0);  // the selective rules keep the matmuls and softmax
}

// The fallback warns once, however many changed forwards follow, and with no
// replans allowed the first change falls back at once.
TEST(BudgetPolicy, FallbackWarnsOnceAndStaysOnTheFixedPolicy) {
  const Problem p = problem();
  auto region = std::make_shared<BudgetRegion>(BudgetSpec{0.5, -1, /*profile_invocations=*/1, /*max_replans=*/0});
  CapturedWarnings warnings;
  step(p, region->factory(), true, 0);  // profile
  ASSERT_EQ(region->status().stage, BudgetRegion::Stage::kPlanned);
  for (int extra : {1, 2, 0, 3}) {
    const Step s = step(p, region->factory(), true, extra);
    EXPECT_TRUE(Matches(s.grads, step(p, {}, false, extra).grads)) << "extra " << extra;
    EXPECT_EQ(region->status().stage, BudgetRegion::Stage::kFallback) << "extra " << extra;
  }
  EXPECT_EQ(region->status().replans, 0);
  int64_t fallback_warnings = 0;
  for (const std::string& m : warnings.messages) fallback_warnings += m.find("hpac budget:") != std::string::npos;
  EXPECT_EQ(fallback_warnings, 1);
}

// A plan made with profile_invocations = 2 waits for the second profile.
TEST(BudgetPolicy, ProfileInvocationsDelayThePlan) {
  const Problem p = problem();
  auto region = std::make_shared<BudgetRegion>(BudgetSpec{1.0, -1, /*profile_invocations=*/2});
  step(p, region->factory(), true);
  EXPECT_EQ(region->status().stage, BudgetRegion::Stage::kProfiling);
  EXPECT_EQ(region->status().profiles, 1);
  step(p, region->factory(), true);
  EXPECT_EQ(region->status().stage, BudgetRegion::Stage::kPlanned);
  const Step replay = step(p, region->factory(), true);
  EXPECT_GT(replay.stats.saved, 0);
}

// Note [Frames hold what needs no recompute]: at 1.0 hpac::checkpoint holds every tensor autograd saves, as off
// does: the recompute never runs, the gradients are off's, and what is live after the forward is off's to the
// byte (the frame drops its inputs' aliases and RNG state too). A layer norm on top: autograd saves its mean and
// rstd, not its output, so no plan within 1.0 can keep it as an op output.
TEST(BudgetPolicy, ABudgetThatCoversOffRecomputesNothing) {
  TrackingAllocator& tracker = TrackingAllocator::install();
  const Chain c;
  const at::Tensor &x = c.x, &w1 = c.w1, &w2 = c.w2;
  auto fn = [&](const at::Tensor& in) {
    return at::layer_norm(at::tanh(at::mm(at::relu(at::mm(in, w1)), w2)), {64}).sum();
  };
  auto live_after_forward = [&](const std::function<at::Tensor()>& run, std::vector<at::Tensor>* grads) {
    const int64_t start = tracker.currentBytes();
    at::Tensor out = run();
    const int64_t live = tracker.currentBytes() - start;
    *grads = torch::autograd::grad({out}, {x, w1, w2});
    return live;
  };
  std::vector<at::Tensor> off;
  const int64_t off_live = live_after_forward([&] { return fn(x); }, &off);
  auto region = std::make_shared<BudgetRegion>(BudgetSpec{1.0, -1});
  for (int i = 0; i < 3; ++i) {
    auto stats = std::make_shared<InvocationStats>();
    CheckpointOptions o;
    o.policy = region->factory();
    o.stats_out = stats;
    std::vector<at::Tensor> grads;
    const int64_t live = live_after_forward([&] { return checkpoint(fn, x, o); }, &grads);
    EXPECT_TRUE(Matches(grads, off)) << i;
    if (i == 0) continue;  // the profile
    EXPECT_EQ(stats->recomputes, 0) << i;
    EXPECT_EQ(stats->served, 0) << i;
    EXPECT_EQ(stats->held, 9) << i;  // mm x2 (2 operands each), relu, tanh, layer_norm (input, mean, rstd)
    EXPECT_EQ(live, off_live) << i;
  }
}

// A test op that sleeps: the timing noise of a busy machine, injected into one profile forward.
TORCH_LIBRARY_FRAGMENT(hpac_budget_test, m) {
  m.def("sleepy(Tensor x, int micros) -> Tensor");
  m.impl("sleepy", c10::DispatchKey::CPU, [](const at::Tensor& x, int64_t micros) {
    std::this_thread::sleep_for(std::chrono::microseconds(micros));
    return x.clone();
  });
}

// Note [Plans from the median profile]: one of three profile forwards runs an op 20 ms slower; the plan's time for
// it is the median, not the outlier, while a single profile takes the outlier.
TEST(BudgetPolicy, PlansComeFromTheMedianOfTheProfiles) {
  const Problem p = problem();
  auto sleepy = c10::Dispatcher::singleton()
                    .findSchemaOrThrow("hpac_budget_test::sleepy", "")
                    .typed<at::Tensor(const at::Tensor&, int64_t)>();
  int64_t noise_us = 0;
  auto noisy_step = [&](const PolicyFactory& policy) {
    CheckpointOptions o;
    o.policy = policy;
    at::Tensor y = checkpoint([&](const at::Tensor& in) {
      at::Tensor h = body(p, in);
      return h + sleepy.call(h.detach(), noise_us).sum() * 0;
    }, p.x, o);
    (y * y).sum().backward();
  };
  auto sleepy_micros = [](const BudgetRegion& region) {
    for (const ProfiledOp& op : region.status().profile) {
      if (op.op == "hpac_budget_test::sleepy") return op.micros;
    }
    return -1.0;
  };
  for (const int64_t profiles : {1, 3}) {
    auto region = std::make_shared<BudgetRegion>(BudgetSpec{0.5, -1, profiles});
    for (int64_t i = 0; i < profiles; ++i) {
      noise_us = i == 0 ? 20000 : 0;
      noisy_step(region->factory());
    }
    ASSERT_EQ(region->status().stage, BudgetRegion::Stage::kPlanned) << profiles;
    if (profiles == 1) {
      EXPECT_GE(sleepy_micros(*region), 20000.0);
    } else {
      EXPECT_LT(sleepy_micros(*region), 10000.0) << "the outlier reached the plan";
    }
  }
}

// Note [Plan files]: a saved plan replays in a new region without a profile, exactly as the region it was made
// in replays it; a region it does not match is an error naming the plan and the first differing op.
TEST(BudgetPolicy, APlanSavedAndLoadedReplaysWithoutAProfile) {
  const Problem p = problem();
  const Step off = step(p, {}, false);
  auto made = std::make_shared<BudgetRegion>(BudgetSpec{0.5, -1});
  step(p, made->factory(), true);  // profile
  const Step replay = step(p, made->factory(), true);
  const std::string text = made->planText();

  auto loaded = BudgetRegion::fromPlanText(text, "plan.txt");
  EXPECT_EQ(loaded->planSource(), "plan.txt");
  ASSERT_EQ(loaded->status().stage, BudgetRegion::Stage::kPlanned);
  EXPECT_EQ(loaded->status().plan.save, made->status().plan.save);
  EXPECT_EQ(loaded->status().plan.kept_bytes, made->status().plan.kept_bytes);
  EXPECT_EQ(loaded->status().plan.off_bytes, made->status().plan.off_bytes);
  EXPECT_EQ(loaded->planText(), text);  // the text survives a round trip
  const Step first = step(p, loaded->factory(), true);  // no profile: the first call replays
  EXPECT_GT(first.stats.saved, 0);
  EXPECT_EQ(first.stats.saved, replay.stats.saved);
  EXPECT_EQ(first.stats.served, replay.stats.served);
  EXPECT_TRUE(Matches(first.grads, off.grads));
  EXPECT_EQ(loaded->status().profiles, 0);

  const std::string msg = errorMessageOf([&] { step(p, loaded->factory(), true, /*extra=*/1); });
  EXPECT_NE(msg.find("the plan 'plan.txt' does not match the region: its op"), std::string::npos) << msg;
  EXPECT_NE(msg.find("softmax"), std::string::npos) << msg;  // the plan's op where the region has a tanh
  EXPECT_NE(msg.find("aten::tanh"), std::string::npos) << msg;
}

TEST(BudgetPolicy, APlanLongerThanTheRegionWarnsOnceAndFallsBack) {
  at::manual_seed(4);
  const at::Tensor x = at::randn({8, 16}).set_requires_grad(true);
  const at::Tensor w = at::randn({16, 16}).set_requires_grad(true);
  auto run = [&](const PolicyFactory& policy, bool longer) {
    CheckpointOptions o;
    o.policy = policy;
    auto fn = [&](const at::Tensor& in) {
      at::Tensor h = at::tanh(at::mm(in, w));
      return longer ? at::sigmoid(h) : h;
    };
    at::Tensor y = policy ? checkpoint(fn, x, o) : fn(x);
    return torch::autograd::grad({y.sum()}, {x, w});
  };
  auto made = std::make_shared<BudgetRegion>(BudgetSpec{1.0, -1});
  run(made->factory(), /*longer=*/true);
  auto loaded = BudgetRegion::fromPlanText(made->planText(), "long.txt");
  CapturedWarnings warnings;
  for (int i = 0; i < 2; ++i) EXPECT_TRUE(Matches(run(loaded->factory(), false), run({}, false)));
  EXPECT_EQ(loaded->status().stage, BudgetRegion::Stage::kFallback);
  ASSERT_EQ(warnings.messages.size(), 1u);
  EXPECT_NE(warnings.messages[0].find("ended before the plan 'long.txt' did (3 ops)"), std::string::npos)
      << warnings.messages[0];
}

TEST(BudgetPolicy, TextThatIsNotAPlanNamesTheLineAndWhatIsAllowed) {
  const Problem p = problem();
  auto made = std::make_shared<BudgetRegion>(BudgetSpec{0.5, -1});
  EXPECT_NE(errorMessageOf([&] { made->planText(); }).find("has no plan to save (stage 'profiling')"),
            std::string::npos);
  step(p, made->factory(), true);
  const std::string good = made->planText();
  auto load = [](const std::string& text) { return errorMessageOf([&] { BudgetRegion::fromPlanText(text, "p"); }); };
  auto replaced = [&](const std::string& from, const std::string& to) {
    std::string t = good;
    const size_t at = t.find(from);
    EXPECT_NE(at, std::string::npos) << from;
    return t.replace(at, from.size(), to);
  };
  EXPECT_NE(load("hello\n").find("'p' is not an hpac budget plan: its first line is 'hello'"), std::string::npos);
  EXPECT_NE(load("").find("ends after line 0; expected 'hpac-budget-plan 1'"), std::string::npos);
  // A plan of another format version (an older hpac's): named as such, with what to do.
  EXPECT_NE(load(replaced("hpac-budget-plan 1", "hpac-budget-plan 0"))
                .find("'p' is a plan of format '0' (its first line is 'hpac-budget-plan 0'); this hpac reads format "
                      "'1' only ('hpac-budget-plan 1'). Plans are not converted: make a new one"),
            std::string::npos);
  EXPECT_NE(load(replaced("budget_bytes", "budget")).find("is not 'budget_bytes <number>'"), std::string::npos);
  EXPECT_NE(load(replaced("aten::mm", "aten::no_such_op")).find("aten::no_such_op is not registered"),
            std::string::npos);
  EXPECT_NE(load(replaced("keep ", "maybe ")).find("is not 'keep|recompute|skip <occurrence>"), std::string::npos);
  EXPECT_NE(load(good + "keep 0 aten::mm - 1 1\n").find("has more than its"), std::string::npos);
  EXPECT_NE(load(good.substr(0, good.rfind("\n", good.size() - 2) + 1)).find("ends after line"), std::string::npos);
  EXPECT_EQ(load(good), "(no error)");
}

TEST(BudgetPolicy, BadSpecsNameTheValueAndWhatIsAllowed) {
  auto message = [](BudgetSpec spec) {
    try {
      validateBudgetSpec(spec);
    } catch (const c10::Error& e) {
      return std::string(e.what_without_backtrace());
    }
    return std::string("(no error)");
  };
  EXPECT_NE(message({1.5, -1}).find("fraction 1.5 is outside [0, 1]"), std::string::npos);
  EXPECT_NE(message({-0.5, -1}).find("fraction -0.5 is outside [0, 1]"), std::string::npos);
  EXPECT_NE(message({-1, -7}).find("bytes -7 is negative"), std::string::npos);
  EXPECT_NE(message({0.5, 100}).find("exactly one of"), std::string::npos);
  EXPECT_NE(message({}).find("(got neither)"), std::string::npos);
  EXPECT_NE(message({0.5, -1, 0}).find("profile_invocations 0"), std::string::npos);
  EXPECT_EQ(message({0.5, -1}), "(no error)");
  EXPECT_EQ(message({-1, 0}), "(no error)");
  // From a front-end: a -1 given explicitly is an error naming it, not "neither".
  auto made = [](std::optional<double> f, std::optional<int64_t> b) {
    try {
      makeBudgetSpec(f, b);
    } catch (const c10::Error& e) {
      return std::string(e.what_without_backtrace());
    }
    return std::string("(no error)");
  };
  EXPECT_NE(made(std::nullopt, -1).find("bytes -1 is negative"), std::string::npos);
  EXPECT_NE(made(-1.0, std::nullopt).find("fraction -1 is outside [0, 1]"), std::string::npos);
  EXPECT_NE(made(std::nullopt, std::nullopt).find("(got neither)"), std::string::npos);
  EXPECT_EQ(made(0.0, std::nullopt), "(no error)");
  EXPECT_EQ(made(std::nullopt, 0), "(no error)");
}

// Note [Plans from the median profile], the stability rule: three fresh runs at one budget give the same plan, or
// plans whose recompute times differ by less than 2 %, read with the ops' true kernel times. Timing noise is
// injected into the profiles: each profiled time is the true one times a log-normal factor (sigma 0.1), and one
// sample in ten is 3x slower (a core taken by another process). A synthetic region of 48 ops, 1 to 64 KiB each, with
// times from 2 to 200 us; budget 0.5; 40 triples of fresh runs per setting.
double recomputeMicros(const BudgetPlan& plan, const std::vector<double>& truth) {
  double t = 0;
  for (size_t i = 0; i < truth.size(); ++i) t += plan.save[i] ? 0.0 : truth[i];
  return t;
}

struct StabilityRun {
  int64_t triples = 0, broken = 0;
  double worst = 0;  // the largest relative spread of a triple's recompute times where the plans differ
};

StabilityRun stability(int64_t profile_invocations, double sigma, double busy_share) {
  std::mt19937 rng(7);
  std::uniform_int_distribution<int64_t> kib(1, 64);
  std::uniform_real_distribution<double> log_micros(std::log(2.0), std::log(200.0));
  std::lognormal_distribution<double> noise(0.0, sigma);
  std::bernoulli_distribution busy(busy_share);
  std::vector<ProfiledOp> ops(48);
  std::vector<double> truth;
  for (size_t i = 0; i < ops.size(); ++i) {
    ops[i].op = "aten::op";
    ops[i].occurrence = static_cast<int64_t>(i);
    ops[i].storages = {{static_cast<int64_t>(i), kib(rng) * 1024}};
    truth.push_back(std::exp(log_micros(rng)));
  }
  StabilityRun r;
  for (int triple = 0; triple < 40; ++triple) {
    std::vector<BudgetPlan> plans;
    for (int run = 0; run < 3; ++run) {
      BudgetRegion region(BudgetSpec{0.5, -1, profile_invocations});
      for (int64_t k = 0; k < profile_invocations; ++k) {
        std::vector<ProfiledOp> profile = ops;
        for (size_t i = 0; i < profile.size(); ++i) profile[i].micros = truth[i] * noise(rng) * (busy(rng) ? 3 : 1);
        region.finishProfile(std::move(profile), std::nullopt, /*frame_holds=*/false, true);
      }
      EXPECT_EQ(region.status().stage, BudgetRegion::Stage::kPlanned);
      plans.push_back(region.status().plan);
    }
    const bool same = plans[0].save == plans[1].save && plans[1].save == plans[2].save;
    double lo = 1e300, hi = 0;
    for (const BudgetPlan& plan : plans) {
      lo = std::min(lo, recomputeMicros(plan, truth));
      hi = std::max(hi, recomputeMicros(plan, truth));
    }
    ++r.triples;
    r.broken += !same && (hi - lo) / lo >= 0.02;
    r.worst = std::max(r.worst, same ? 0.0 : (hi - lo) / lo);
  }
  std::printf("profile_invocations %lld, sigma %.2f, busy %.1f: %lld of %lld triples break the rule (worst %.2f %%)\n",
              static_cast<long long>(profile_invocations), sigma, busy_share, static_cast<long long>(r.broken),
              static_cast<long long>(r.triples), 100 * r.worst);
  return r;
}

TEST(BudgetPolicy, PlansFromNineProfilesMeetTheStabilityRuleUnderTimingNoise) {
  EXPECT_EQ(stability(9, 0.1, 0.1).broken, 0) << "the median of 9 profiles must outvote the slow samples";
  // One timed forward decides alone: the rule breaks in most triples (what the median is for).
  EXPECT_GE(stability(1, 0.1, 0.1).broken, 20);
}

}  // namespace
}  // namespace hpac
