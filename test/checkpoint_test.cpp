// Checkpoint: loss, input and parameter gradients equal to the same block
// without checkpointing (full and selective, backward() and autograd::grad),
// recompute evidence, memory ordering, reentrant variant, determinism check,
// extra backward, backward on another thread, inputs without grad.
#include "policy/field_policies.h"
#include "policy/selective_policy.h"
#include "replay/checkpoint.h"
#include "test/support/parity.h"
#include "tools/evidence/evidence.h"
#include "tools/moe/moe_block.h"
#include "replay/tracking_allocator.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <torch/csrc/autograd/autograd.h>

#include <thread>

namespace hpac {
namespace {

std::vector<MoeBlock> makeBlocks(int n) {
  std::vector<MoeBlock> blocks;
  for (int i = 0; i < n; ++i) blocks.emplace_back(MoeBlockConfig{}, 100 + i);
  return blocks;
}

at::Tensor makeInput() {
  at::manual_seed(7);
  return at::randn({2, 32, MoeBlockConfig{}.hidden});
}

// Backward through `y` must stop with hpac's determinism error.
void ExpectDeterminismError(const at::Tensor& y) {
  try {
    y.sum().backward();
    FAIL() << "expected a determinism error";
  } catch (const c10::Error& e) {
    EXPECT_NE(std::string(e.what()).find("is not deterministic"), std::string::npos) << e.what();
  }
}

class ParityTest : public ::testing::TestWithParam<CheckpointMode> {};

// Bitwise parity: the recompute runs the same ops in the same order on the same
// values (cached outputs are the forward's own), so fp32 CPU results are equal.
TEST_P(ParityTest, LossAndGradientsEqualNoCheckpointing) {
  const auto blocks = makeBlocks(3);
  const at::Tensor x = makeInput();
  const StepReport off = runStep(blocks, x, CheckpointMode::kOff, 99);
  const StepReport ck = runStep(blocks, x, GetParam(), 99);
  EXPECT_TRUE(ScalarMatches(ck.loss, off.loss));
  for (size_t i = 0; i < ck.grads.size(); ++i) ASSERT_TRUE(ck.grads[i].defined()) << ck.grad_names[i];
  EXPECT_TRUE(Matches(ck.grads, off.grads, 0, off.grad_names));
  // Evidence that backward re-ran the region: every block recomputed once.
  EXPECT_EQ(ck.stats.recomputes, 3);
  EXPECT_GT(ck.stats.ops_recompute, 0);
  EXPECT_GT(ck.stats.recomputed, 0);
  // Note [The recompute stops early]: each block's recompute ends at the last tensor autograd saved; the ops
  // after it (the residual add, ...) do not run again.
  EXPECT_LT(ck.stats.ops_recompute, ck.stats.ops_forward);
  if (GetParam() == CheckpointMode::kSelective) {
    EXPECT_GT(ck.stats.saved, 0);
    EXPECT_EQ(ck.stats.served + ck.stats.unserved, ck.stats.saved);  // every saved output served once or released
  } else {
    EXPECT_EQ(ck.stats.saved, 0);
    EXPECT_EQ(ck.stats.recomputed, ck.stats.ops_recompute);
  }
}

INSTANTIATE_TEST_SUITE_P(Modes, ParityTest, ::testing::Values(CheckpointMode::kFull, CheckpointMode::kSelective),
                         [](const auto& info) { return std::string(toString(info.param)); });

TEST(Checkpoint, AutogradGradMatchesForFullAndSelective) {
  const MoeBlock block(MoeBlockConfig{}, 5);
  const at::Tensor x0 = makeInput();
  auto grads = [&](CheckpointMode mode) {
    at::Tensor x = x0.clone().set_requires_grad(true);
    at::manual_seed(3);
    at::Tensor y;
    if (mode == CheckpointMode::kOff) {
      y = block.forward(x);
    } else {
      y = checkpoint([&](const at::Tensor& in) { return block.forward(in); }, x, checkpointOptionsFor(mode));
    }
    std::vector<at::Tensor> wrt{x};
    for (const auto& p : block.parameters()) wrt.push_back(p);
    return torch::autograd::grad({y.sum()}, wrt);
  };
  const auto off = grads(CheckpointMode::kOff);
  for (CheckpointMode mode : {CheckpointMode::kFull, CheckpointMode::kSelective}) {
    const auto got = grads(mode);
    EXPECT_TRUE(Matches(got, off)) << toString(mode);
  }
}

TEST(Checkpoint, KeptMemoryAfterForwardIsFullBelowSelectiveBelowOff) {
  const auto blocks = makeBlocks(3);
  const at::Tensor x = makeInput();
  const StepReport off = runStep(blocks, x, CheckpointMode::kOff, 1);
  const StepReport full = runStep(blocks, x, CheckpointMode::kFull, 1);
  const StepReport sel = runStep(blocks, x, CheckpointMode::kSelective, 1);
  EXPECT_LT(full.kept_after_forward, sel.kept_after_forward);
  EXPECT_LT(sel.kept_after_forward, off.kept_after_forward);
  // What selective keeps beyond full is what it saved (plus nothing else).
  EXPECT_GE(sel.kept_after_forward - full.kept_after_forward, sel.stats.saved_bytes / 2);
}

TEST(Checkpoint, OddMatmulCountInOneRegion) {
  // Three bias-free linears: mm #0 and #2 saved, #1 recomputed — in both phases.
  at::manual_seed(0);
  const at::Tensor w = at::randn({8, 8}).set_requires_grad(true);
  const at::Tensor x = at::randn({4, 8}).set_requires_grad(true);
  auto fn = [&](const at::Tensor& in) { return at::linear(at::linear(at::linear(in, w).relu(), w).relu(), w); };
  auto stats = std::make_shared<InvocationStats>();
  CheckpointOptions o;
  o.policy = selectivePolicy();
  o.stats_out = stats;
  o.early_stop = false;  // this test counts every op of the recompute (Note [The recompute stops early])
  at::Tensor y = checkpoint(fn, x, o);
  const auto got = torch::autograd::grad({y.sum()}, {x, w});
  y = at::Tensor();  // drop the graph: the frame reports its stats
  const auto want = torch::autograd::grad({fn(x).sum()}, {x, w});
  EXPECT_TRUE(Matches(got, want));
  EXPECT_EQ(stats->saved, 2);
  EXPECT_EQ(stats->served, 2);
}

TEST(Checkpoint, InputsWithoutGradAndBackwardOnAnotherThread) {
  const MoeBlock block(MoeBlockConfig{}, 11);
  const at::Tensor x = makeInput();  // does not require grad
  auto run = [&](bool ck, bool other_thread) {
    for (at::Tensor p : block.parameters()) p.mutable_grad().reset();
    at::manual_seed(4);
    CheckpointOptions o;
    o.policy = selectivePolicy();
    at::Tensor y = ck ? checkpoint([&](const at::Tensor& in) { return block.forward(in); }, x, o) : block.forward(x);
    at::Tensor loss = y.pow(2).mean();
    if (other_thread) {
      std::thread t([&] { loss.backward(); });
      t.join();
    } else {
      loss.backward();
    }
    std::vector<at::Tensor> g;
    for (const auto& p : block.parameters()) g.push_back(p.grad().clone());
    return g;
  };
  const auto want = run(false, false);
  EXPECT_TRUE(Matches(run(true, true), want));
}

TEST(Checkpoint, ReentrantVariantMatches) {
  const MoeBlock block(MoeBlockConfig{}, 21);
  const at::Tensor x0 = makeInput();
  auto run = [&](bool ck) {
    for (at::Tensor p : block.parameters()) p.mutable_grad().reset();
    at::Tensor x = x0.clone().set_requires_grad(true);
    at::manual_seed(8);
    at::Tensor y;
    if (ck) {
      CheckpointOptions o;
      o.use_reentrant = true;
      o.parameters = block.parameters();
      y = checkpoint([&](const at::Tensor& in) { return block.forward(in); }, x, o);
    } else {
      y = block.forward(x);
    }
    y.pow(2).mean().backward();
    std::vector<at::Tensor> g{x.grad()};
    for (const auto& p : block.parameters()) g.push_back(p.grad().clone());
    return g;
  };
  EXPECT_TRUE(Matches(run(true), run(false)));

  CheckpointOptions bad;
  bad.use_reentrant = true;
  bad.policy = selectivePolicy();
  EXPECT_THROW(checkpoint([](const at::Tensor& in) { return in * 2; }, x0.clone().set_requires_grad(true), bad),
               c10::Error);
}

TEST(Checkpoint, NondeterministicRegionIsReported) {
  const at::Tensor x = at::randn({4, 4}).set_requires_grad(true);
  int calls = 0;
  // The recompute takes another branch: it saves a different number of tensors.
  auto fn = [&](const at::Tensor& in) { return ++calls == 1 ? in.exp() : in.sin().cos(); };
  CheckpointOptions o;
  o.early_stop = false;  // stopped after the first saved tensor, the recompute would not reach the difference
  at::Tensor y = checkpoint(fn, x, o);
  ExpectDeterminismError(y);
}

// Note [The recompute stops early]: the recompute ends once it has packed the last saved tensor the frame does not
// hold; what fn runs after it is neither dispatched nor counted. exp, sin, exp, cos, mul, add: autograd saves a (exp
// its result, after it ran; sin its argument, before it runs) and c (the same by the second exp and cos).
TEST(Checkpoint, TheRecomputeStopsAfterTheLastTensorTheFrameDoesNotHold) {
  const at::Tensor x = at::randn({4, 4}).set_requires_grad(true);
  auto fn = [](const at::Tensor& in) { return in.exp().sin().exp().cos() * 2 + 1; };
  const auto want = torch::autograd::grad({fn(x).sum()}, {x});
  struct Case {
    PolicyFactory policy;
    bool early_stop;
    int64_t ops_recompute;  // of the forward's 6
    int64_t served;
  };
  // Full: the recompute stops as cos saves c, before cos runs (3 ops; cos, mul and add do not run). Keeping the
  // second exp's output (c) lets the frame hold c: it stops as sin saves a (1 op; the kept c is released unserved).
  const Case cases[] = {{{}, true, 3, 0},
                        {{}, false, 6, 0},
                        {occurrencePolicy({"aten::exp@1"}), true, 1, 0},
                        {occurrencePolicy({"aten::exp@1"}), false, 6, 1}};
  for (const Case& c : cases) {
    auto stats = std::make_shared<InvocationStats>();
    CheckpointOptions o;
    o.policy = c.policy;
    o.early_stop = c.early_stop;
    o.stats_out = stats;
    at::Tensor y = checkpoint(fn, x, o);
    const auto got = torch::autograd::grad({y.sum()}, {x});
    y = at::Tensor();
    EXPECT_TRUE(Matches(got, want));
    EXPECT_EQ(stats->ops_forward, 6);
    EXPECT_EQ(stats->recomputes, 1);
    EXPECT_EQ(stats->ops_recompute, c.ops_recompute) << c.early_stop;
    EXPECT_EQ(stats->served, c.served) << c.early_stop;
  }
}

// The determinism check covers the prefix an early-stopped recompute produced.
TEST(Checkpoint, AnEarlyStoppedRecomputeIsStillCheckedForDeterminism) {
  const at::Tensor x = at::randn({4, 4}).set_requires_grad(true);
  int calls = 0;
  auto fn = [&](const at::Tensor& in) { return (++calls == 1 ? in.exp() : in.sum(0).exp()).sin() * 2; };
  at::Tensor y = checkpoint(fn, x);
  ExpectDeterminismError(y);
}

// Note [Routing is verified]: the scores of a router depend on a tensor that moves between forward and backward
// (autograd allows it: x + bias saves neither), so the recompute's topk chooses other experts.
TEST(Checkpoint, RouterDriftIsAnErrorUnlessRoutingIsSaved) {
  const at::Tensor w = at::randn({8, 8}).set_requires_grad(true);
  const at::Tensor x = at::randn({12, 8}).set_requires_grad(true);
  for (const bool full : {true, false}) {
    for (const RoutingRule rule : {RoutingRule::kVerify, RoutingRule::kSave}) {
      at::Tensor bias = at::zeros({8});
      auto fn = [&](const at::Tensor& in) {
        const at::Tensor scores = at::linear(in, w) + bias;
        const auto [values, experts] = at::topk(scores.softmax(-1), 2);
        return (values * experts.to(at::kFloat)).sum(-1);
      };
      at::Tensor expected;
      {
        at::NoGradGuard none;
        expected = fn(x);
      }
      CheckpointOptions o;
      if (!full) o.policy = selectivePolicy();
      o.routing = rule;
      auto stats = std::make_shared<InvocationStats>();
      o.stats_out = stats;
      at::Tensor y = checkpoint(fn, x, o);
      EXPECT_TRUE(at::equal(y, expected));
      bias.copy_(at::randn({8}) * 10);  // the router moves before backward
      if (rule == RoutingRule::kSave) {
        y.sum().backward();
        continue;
      }
      try {
        y.sum().backward();
        FAIL() << "expected a routing error (full " << full << ")";
      } catch (const c10::Error& e) {
        EXPECT_NE(std::string(e.what()).find("aten::topk (default overload) occurrence 0 of invocation"),
                  std::string::npos) << e.what();
        EXPECT_NE(std::string(e.what()).find("routed differently in the recompute"), std::string::npos) << e.what();
      }
    }
  }
}

// Note [State written twice]: a counter outside the region, added to in place by the checkpointed function.
TEST(Checkpoint, WritesToOutsideTensorsAreMadeOnceWithSkip) {
  const at::Tensor w = at::randn({6, 6}).set_requires_grad(true);
  const at::Tensor x = at::randn({3, 6}).set_requires_grad(true);
  for (const StateWriteRule rule : {StateWriteRule::kWarn, StateWriteRule::kSkip, StateWriteRule::kError}) {
    for (const bool full : {true, false}) {
      at::Tensor counter = at::zeros({6});
      auto fn = [&](const at::Tensor& in) {
        const at::Tensor h = at::linear(in, w).tanh();
        counter.add_(h.detach().sum(0));
        return h * 2;
      };
      CheckpointOptions o;
      if (!full) o.policy = selectivePolicy();
      o.state_writes = rule;
      o.early_stop = false;  // stopped early, the recompute would end before the write (Note [The recompute stops early])
      auto stats = std::make_shared<InvocationStats>();
      o.stats_out = stats;
      at::Tensor y = checkpoint(fn, x, o);
      const at::Tensor once = counter.clone();
      if (rule == StateWriteRule::kError) {
        EXPECT_THROW(y.sum().backward(), c10::Error);
        continue;
      }
      y.sum().backward();
      y = at::Tensor();
      EXPECT_TRUE(at::equal(counter, rule == StateWriteRule::kSkip ? once : once * 2)) << toString(rule) << full;
      EXPECT_EQ(stats->state_writes, 1);
      EXPECT_EQ(stats->state_writes_skipped, rule == StateWriteRule::kSkip ? 1 : 0);
    }
  }
}

TEST(Checkpoint, SelectiveBackwardTwiceIsAnExtraBackwardError) {
  const at::Tensor w = at::randn({6, 6}).set_requires_grad(true);
  const at::Tensor x = at::randn({3, 6}).set_requires_grad(true);
  CheckpointOptions o;
  o.policy = selectivePolicy();
  at::Tensor y = checkpoint([&](const at::Tensor& in) { return at::linear(in, w).tanh(); }, x, o).sum();
  y.backward({}, /*retain_graph=*/true);
  try {
    y.backward();
    FAIL() << "expected an extra-backward error";
  } catch (const c10::Error& e) {
    EXPECT_NE(std::string(e.what()).find("an extra time"), std::string::npos) << e.what();
  }
}

TEST(Checkpoint, FullBackwardTwiceRecomputesAgain) {
  const at::Tensor w = at::randn({6, 6}).set_requires_grad(true);
  const at::Tensor x = at::randn({3, 6}).set_requires_grad(true);
  at::Tensor y = checkpoint([&](const at::Tensor& in) { return at::linear(in, w).tanh(); }, x).sum();
  y.backward({}, /*retain_graph=*/true);
  const at::Tensor first = w.grad().clone();
  y.backward();
  EXPECT_TRUE(at::allclose(w.grad(), first * 2));
}

TEST(Checkpoint, NoGradForwardCachesNothing) {
  const at::Tensor w = at::randn({6, 6});
  auto stats = std::make_shared<InvocationStats>();
  CheckpointOptions o;
  o.policy = selectivePolicy();
  o.stats_out = stats;
  at::NoGradGuard no_grad;
  const at::Tensor y = checkpoint([&](const at::Tensor& in) { return at::linear(in, w); }, at::randn({2, 6}), o);
  EXPECT_EQ(stats->saved, 0);
  EXPECT_EQ(stats->ops_forward, 0);  // the region is not entered at all
}

TEST(Checkpoint, DroppedGraphFreesEverything) {
  TrackingAllocator& tracker = TrackingAllocator::install();
  const MoeBlock block(MoeBlockConfig{}, 31);
  const at::Tensor x = makeInput();
  const int64_t before = tracker.currentBytes();
  {
    CheckpointOptions o;
    o.policy = selectivePolicy();
    at::Tensor y = checkpoint([&](const at::Tensor& in) { return block.forward(in); }, x, o);
    EXPECT_GT(tracker.currentBytes(), before);
  }  // forward without backward: graph, placeholders, frame and cache dropped
  EXPECT_EQ(tracker.currentBytes(), before);
}

}  // namespace
}  // namespace hpac
