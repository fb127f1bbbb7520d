// Explain (replay/explain.h): the recorder's rows against what the fallback
// did (the invocation's stats), bytes of a hand-computed region, the memory
// timeline of a known allocation, nothing recorded when explain is off.
#include "policy/budget_policy.h"
#include "policy/selective_policy.h"
#include "replay/checkpoint.h"
#include "replay/explain.h"
#include "replay/region.h"
#include "replay/tracking_allocator.h"
#include "tools/explain/explain_moe.h"
#include "tools/moe/moe_block.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <map>

namespace hpac {
namespace {

int64_t counted(const std::vector<ExplainedOp>& ops, Phase phase) {
  int64_t n = 0;
  for (const ExplainedOp& o : ops) n += o.phase == phase && o.decision != "ignore";
  return n;
}

// Every count the invocation's stats keep equals the recorder's rows.
void expectRowsMatchStats(const DecisionRecorder& r, const InvocationStats& s) {
  EXPECT_EQ(r.count(Phase::kForward, "save"), s.saved);
  EXPECT_EQ(counted(r.ops(), Phase::kForward), s.ops_forward);
  EXPECT_EQ(counted(r.ops(), Phase::kRecompute), s.ops_recompute);
  EXPECT_EQ(r.count(Phase::kRecompute, "serve"), s.served);
  EXPECT_EQ(r.count(Phase::kRecompute, "recompute"), s.recomputed);
  EXPECT_EQ(r.count(Phase::kForward, "ignore") + r.count(Phase::kRecompute, "ignore"), s.ignored);
}

TEST(Explain, RecordsWhatTheFallbackDidOnTheMoeBlockUnderSelective) {
  MoeBlock block(MoeBlockConfig{}, 3);
  at::manual_seed(0);
  at::Tensor x = at::randn({2, 16, 64}).set_requires_grad(true);
  auto recorder = std::make_shared<DecisionRecorder>();
  auto stats = std::make_shared<InvocationStats>();
  CheckpointOptions o;
  o.policy = selectivePolicy();
  o.explain = recorder;
  o.stats_out = stats;
  at::Tensor y = checkpoint([&](const at::Tensor& in) { return block.forward(in); }, x, o);
  y.pow(2).mean().backward();
  y = at::Tensor();
  ASSERT_GT(stats->saved, 0);
  ASSERT_GT(stats->served, 0);
  ASSERT_GT(stats->recomputed, 0);
  expectRowsMatchStats(*recorder, *stats);
  // Each forward row names the selective rule; each served row replays a forward save.
  std::map<std::pair<std::string, int64_t>, std::string> forward;
  for (const ExplainedOp& op : recorder->ops()) {
    if (op.phase == Phase::kForward && op.decision != "ignore") {
      EXPECT_EQ(op.rule.rfind("selective rule ", 0), 0u) << op.op << ": " << op.rule;
      EXPECT_EQ(op.decision == "save", op.answer == "MUST_SAVE") << op.op;
      forward[{op.op, op.occurrence}] = op.decision;
    }
    if (op.phase == Phase::kRecompute && op.decision == "serve") {
      EXPECT_EQ((forward[{op.op, op.occurrence}]), "save") << op.op << " " << op.occurrence;
    }
    if (op.op == "aten::topk" && op.phase == Phase::kForward) {
      EXPECT_EQ(op.rule, "selective rule 1: recompute table");
    }
  }
}

// x [4, 8] and w [8, 16], w2 [4, 8] float32; save list {mm, transpose, neg}:
//   a = mm(x, w)        4x16x4 = 256 B new, saved: keeps 256
//   t = a.transpose()   a view of a: 0 B new; listed, but a view is recomputed (Note [Views are recomputed])
//   r = neg(t)          16x4x4 = 256 B new, saved: keeps 256
//   r.mul_(2)           in place: 0 B new, not saved
//   y = mm(r, w2)       16x8x4 = 512 B new, saved: keeps 512
TEST(Explain, OutputAndKeptBytesOfAHandComputedRegion) {
  at::manual_seed(1);
  at::Tensor x = at::randn({4, 8}).set_requires_grad(true);
  at::Tensor w = at::randn({8, 16}).set_requires_grad(true);
  at::Tensor w2 = at::randn({4, 8}).set_requires_grad(true);
  auto recorder = std::make_shared<DecisionRecorder>();
  auto stats = std::make_shared<InvocationStats>();
  CheckpointOptions o;
  o.policy = saveListPolicy({"aten::mm", "aten::transpose.int", "aten::neg"});
  o.explain = recorder;
  o.stats_out = stats;
  at::Tensor y = checkpoint(
      [&](const at::Tensor& in) {
        at::Tensor r = at::neg(at::mm(in, w).transpose(0, 1));
        r.mul_(2);
        return at::mm(r, w2);
      },
      x, o);
  y.sum().backward();
  y = at::Tensor();
  struct Want {
    std::string op;
    int64_t occurrence;
    std::string decision;
    int64_t output_bytes, kept_bytes;
  };
  const std::vector<Want> want = {{"aten::mm", 0, "save", 256, 256},
                                  {"aten::transpose.int", 0, "recompute", 0, 0},
                                  {"aten::neg", 0, "save", 256, 256},
                                  {"aten::mul_.Scalar", 0, "recompute", 0, 0},
                                  {"aten::mm", 1, "save", 512, 512}};
  std::vector<Want> got;
  for (const ExplainedOp& op : recorder->ops()) {
    if (op.phase == Phase::kForward && op.decision != "ignore") {
      got.push_back({op.op, op.occurrence, op.decision, op.output_bytes, op.kept_bytes});
    }
  }
  ASSERT_EQ(got.size(), want.size());
  for (const ExplainedOp& op : recorder->ops()) {
    if (op.op == "aten::transpose.int" && op.phase == Phase::kForward) {
      EXPECT_EQ(op.answer, "MUST_SAVE");
      EXPECT_NE(op.rule.find("recomputed anyway: its result aliases its input"), std::string::npos) << op.rule;
    }
  }
  for (size_t i = 0; i < want.size(); ++i) {
    EXPECT_EQ(got[i].op, want[i].op) << i;
    EXPECT_EQ(got[i].occurrence, want[i].occurrence) << i;
    EXPECT_EQ(got[i].decision, want[i].decision) << i;
    EXPECT_EQ(got[i].output_bytes, want[i].output_bytes) << want[i].op;
    EXPECT_EQ(got[i].kept_bytes, want[i].kept_bytes) << want[i].op;
  }
  expectRowsMatchStats(*recorder, *stats);
}

TEST(Explain, NothingIsRecordedOrTimedWhenOff) {
  auto unattached = std::make_shared<DecisionRecorder>();
  Invocation invocation(selectivePolicy());
  EXPECT_FALSE(invocation.timing());
  EXPECT_EQ(invocation.recorder(), nullptr);
  {
    RegionGuard region(invocation, Phase::kForward);
    at::Tensor a = at::mm(at::ones({2, 2}), at::ones({2, 2}));
    EXPECT_FALSE(invocation.timing()) << "explain off: the fallback must take its untimed path";
  }
  EXPECT_GT(invocation.stats().ops_forward, 0);
  EXPECT_TRUE(unattached->ops().empty());
  // And on: the same region records its op.
  Invocation explained(selectivePolicy(), InvocationOptions{false, unattached});
  {
    RegionGuard region(explained, Phase::kForward);
    EXPECT_TRUE(explained.timing());
    at::Tensor a = at::mm(at::ones({2, 2}), at::ones({2, 2}));
  }
  EXPECT_EQ(unattached->count(Phase::kForward, "save"), 1);
}

TEST(Explain, TimelineOfAKnownAllocation) {
  TrackingAllocator::install();
  TimelineCapture capture;
  {
    at::Tensor t = at::empty({256}, at::kFloat);  // 1024 bytes
    capture.mark("after alloc");
  }
  const TimelineTrace trace = capture.finish("test");
  EXPECT_EQ(trace.bytes, (std::vector<int64_t>{1024, 0}));
  EXPECT_EQ(trace.peak_bytes, 1024);
  ASSERT_EQ(trace.marks.size(), 1u);
  EXPECT_EQ(trace.marks[0].second, 1);
}

TEST(Explain, BudgetRowsNameThePlanEntry) {
  MoeExplainOptions o;
  o.blocks = 1;
  o.mode = "budget";
  o.budget = 0.5;
  o.timeline_modes = {"off", "budget"};
  const ExplainReport report = explainMoeBlocks(o);
  ASSERT_EQ(report.timelines.size(), 2u);
  int64_t saves = 0, planned = 0;
  for (const ExplainedOp& op : report.ops) {
    if (op.phase != Phase::kForward || op.decision == "ignore") continue;
    saves += op.decision == "save";
    planned += op.rule.rfind("budget plan entry ", 0) == 0;
  }
  EXPECT_EQ(saves, report.stats.saved);
  EXPECT_EQ(planned, report.stats.ops_forward) << "every counted op of the explained step replays the plan";
}

TEST(Explain, RejectsUnknownModeAndRegion) {
  MoeExplainOptions o;
  o.mode = "sometimes";
  EXPECT_THROW(
      {
        try {
          explainMoeBlocks(o);
        } catch (const c10::Error& e) {
          EXPECT_NE(std::string(e.what()).find("unknown mode 'sometimes'; allowed: off, full, selective, budget"),
                    std::string::npos);
          throw;
        }
      },
      c10::Error);
  o.mode = "selective";
  o.region = 5;
  EXPECT_THROW(explainMoeBlocks(o), c10::Error);
}

// A write to an outside tensor that state_writes: skip does not make again is a skip row naming its Note, like the
// recompute's other skipped ops (it had no decision at all before).
TEST(Explain, AnOutsideWriteNotMadeAgainIsASkipRow) {
  const at::Tensor w = at::randn({6, 6}).set_requires_grad(true);
  const at::Tensor x = at::randn({3, 6}).set_requires_grad(true);
  at::Tensor counter = at::zeros({6});
  auto recorder = std::make_shared<DecisionRecorder>();
  CheckpointOptions o;
  o.state_writes = StateWriteRule::kSkip;
  o.explain = recorder;
  o.early_stop = false;  // stopped early, the recompute would end before the write (Note [The recompute stops early])
  at::Tensor y = checkpoint(
      [&](const at::Tensor& in) {
        const at::Tensor h = at::linear(in, w).tanh();
        counter.add_(h.detach().sum(0));
        return h * 2;
      },
      x, o);
  y.sum().backward();
  int64_t skipped_writes = 0;
  for (const ExplainedOp& op : recorder->ops()) {
    if (op.phase != Phase::kRecompute || op.op != "aten::add_.Tensor") continue;
    EXPECT_EQ(op.decision, "skip");
    EXPECT_NE(op.rule.find("Note [State written twice]"), std::string::npos) << op.rule;
    ++skipped_writes;
  }
  EXPECT_EQ(skipped_writes, 1);
}

}  // namespace
}  // namespace hpac
