// Invocation: served kernels really do not run, served outputs equal the
// originals, the recompute replays the forward's decisions, entries are
// released (and reported when never asked for), each error is raised with its
// message, writes through unsafe views are copied or refused.
#include "plugin/fallback.h"
#include "policy/checkpoint_policy.h"
#include "replay/dispatch_key.h"
#include "replay/invocation.h"
#include "replay/region.h"

#include "replay/torch_compat.h"
#include "test/support/captured_warnings.h"
#include "test/support/error_message.h"
#include "test/support/parity.h"

#include <ATen/ATen.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <gtest/gtest.h>
#include <torch/library.h>

#include <atomic>
#include <iostream>
#include <string>

namespace hpac {
namespace {

std::atomic<int> counted_mm_calls{0};

at::Tensor countedMm(const at::Tensor& a, const at::Tensor& b) {
  ++counted_mm_calls;
  return at::mm(a, b);
}

// A test op whose kernel counts its calls, registered for the lifetime of the
// fixture (RAII: the Library objects deregister on destruction).
class ReplayTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    def_ = new torch::Library(torch::Library::DEF, "hpac_test", c10::nullopt, __FILE__, __LINE__);
    def_->def("counted_mm(Tensor a, Tensor b) -> Tensor");
    impl_ = new torch::Library(torch::Library::IMPL, "hpac_test", c10::DispatchKey::CPU, __FILE__, __LINE__);
    impl_->impl("counted_mm", TORCH_FN(countedMm));
  }
  static void TearDownTestSuite() {
    delete impl_;
    delete def_;
  }
  void SetUp() override { counted_mm_calls = 0; }

  static at::Tensor callCountedMm(const at::Tensor& a, const at::Tensor& b) {
    static auto op = c10::Dispatcher::singleton()
                         .findSchemaOrThrow("hpac_test::counted_mm", "")
                         .typed<at::Tensor(const at::Tensor&, const at::Tensor&)>();
    return op.call(a, b);
  }

  // A forward that saves two counted_mm outputs of a @ a (occurrences 1 and 2).
  static void forwardTwoCountedMms(Invocation& inv, const at::Tensor& a) {
    RegionGuard region(inv, Phase::kForward);
    callCountedMm(a, a);
    callCountedMm(a, a);
  }

  static torch::Library* def_;
  static torch::Library* impl_;
};
torch::Library* ReplayTest::def_ = nullptr;
torch::Library* ReplayTest::impl_ = nullptr;

TEST_F(ReplayTest, ServedKernelsDoNotRunAndOutputsMatch) {
  Invocation inv(saveListPolicy({"hpac_test::counted_mm"}));
  const at::Tensor a = at::randn({5, 6}), b = at::randn({6, 7}), c = at::randn({7, 3});
  at::Tensor f1, f2;
  {
    RegionGuard region(inv, Phase::kForward);
    f1 = callCountedMm(a, b);
    f2 = callCountedMm(f1, c);
  }
  EXPECT_EQ(counted_mm_calls, 2);
  EXPECT_EQ(inv.storedEntries(), 2u);
  EXPECT_EQ(inv.storedBytes(), (5 * 7 + 5 * 3) * 4);
  at::Tensor r1, r2;
  {
    RegionGuard region(inv, Phase::kRecompute);
    r1 = callCountedMm(a, b);
    EXPECT_EQ(inv.storedEntries(), 1u);  // released as served
    r2 = callCountedMm(r1, c);
  }
  EXPECT_EQ(counted_mm_calls, 2) << "a served op ran its kernel";
  EXPECT_TRUE(Matches({r1}, {f1}));
  EXPECT_TRUE(Matches({r2}, {f2}));
  EXPECT_NE(r1.unsafeGetTensorImpl(), f1.unsafeGetTensorImpl());  // a fresh alias, not the original
  EXPECT_EQ(inv.storedEntries(), 0u);
  EXPECT_EQ(inv.storedBytes(), 0);
  EXPECT_EQ(inv.stats().saved, 2);
  EXPECT_EQ(inv.stats().served, 2);
  EXPECT_EQ(inv.stats().ops_forward, 2);
  EXPECT_EQ(inv.stats().ops_recompute, 2);
}

TEST_F(ReplayTest, RecomputedOpsRunAgain) {
  Invocation inv(PolicyFactory{});  // recompute everything
  const at::Tensor a = at::randn({4, 4});
  for (Phase phase : {Phase::kForward, Phase::kRecompute}) {
    RegionGuard region(inv, phase);
    callCountedMm(a, a);
  }
  EXPECT_EQ(counted_mm_calls, 2);
  EXPECT_EQ(inv.stats().recomputed, 1);
  EXPECT_EQ(inv.stats().saved, 0);
}

// Note [Decided after the op]: each op kept provisionally, the answer settled after it; what the answers settled is
// what the recompute serves, and runsInRecompute() says so before each op.
TEST_F(ReplayTest, AnswersSettledAfterTheOpAreReplayed) {
  Invocation inv(decidedAfterRunPolicy());
  const c10::OperatorHandle mm = c10::Dispatcher::singleton().findSchemaOrThrow("hpac_test::counted_mm", "");
  const c10::OperatorHandle add = c10::Dispatcher::singleton().findSchemaOrThrow("aten::add", "Tensor");
  const at::Tensor a = at::randn({4, 4});
  {
    RegionGuard region(inv, Phase::kForward);
    callCountedMm(a, a);
    EXPECT_FALSE(inv.settleLast(add, CheckpointPolicy::MUST_SAVE)) << "settled an op that is not the last kept";
    EXPECT_TRUE(inv.settleLast(mm, CheckpointPolicy::PREFER_RECOMPUTE));  // occurrence 0: released again
    EXPECT_EQ(inv.storedEntries(), 0u);
    callCountedMm(a, a);
    EXPECT_TRUE(inv.settleLast(mm, CheckpointPolicy::MUST_SAVE));  // occurrence 1: kept
    EXPECT_FALSE(inv.settleLast(mm, CheckpointPolicy::MUST_RECOMPUTE)) << "settled twice";
    callCountedMm(a, a);  // occurrence 2: never answered, recomputed
  }
  EXPECT_EQ(inv.stats().saved, 1);
  EXPECT_EQ(inv.storedEntries(), 1u);
  EXPECT_EQ(inv.storedBytes(), 4 * 4 * 4);
  {
    RegionGuard region(inv, Phase::kRecompute);
    for (bool runs : {true, false, true}) {
      EXPECT_EQ(inv.runsInRecompute(mm), runs);
      callCountedMm(a, a);
    }
  }
  EXPECT_EQ(counted_mm_calls, 3 + 2);
  EXPECT_EQ(inv.stats().served, 1);
  EXPECT_EQ(inv.stats().recomputed, 2);
}

TEST_F(ReplayTest, MissingEntryNamesOpOccurrenceAndInvocation) {
  Invocation inv(saveListPolicy({"hpac_test::counted_mm"}));
  const at::Tensor a = at::randn({3, 3});
  {
    RegionGuard region(inv, Phase::kForward);
    callCountedMm(a, a);
  }
  RegionGuard region(inv, Phase::kRecompute);
  callCountedMm(a, a);
  const std::string msg = errorMessageOf([&] { callCountedMm(a, a); });
  EXPECT_NE(msg.find("hpac_test::counted_mm (default overload) occurrence 1 of invocation " + std::to_string(inv.id()) +
                     " is not in storage"),
            std::string::npos)
      << msg;
}

TEST_F(ReplayTest, SecondRecomputeIsAnExtraBackward) {
  Invocation inv(saveListPolicy({"hpac_test::counted_mm"}));
  const at::Tensor a = at::randn({3, 3});
  for (Phase phase : {Phase::kForward, Phase::kRecompute}) {
    RegionGuard region(inv, phase);
    callCountedMm(a, a);
  }
  RegionGuard region(inv, Phase::kRecompute);
  const std::string msg = errorMessageOf([&] { callCountedMm(a, a); });
  EXPECT_NE(msg.find("occurrence 0 of invocation " + std::to_string(inv.id()) + " was already served"),
            std::string::npos)
      << msg;
  EXPECT_NE(msg.find("an extra time"), std::string::npos) << msg;
}

// Note [Decisions are recorded]: the policy is asked in the forward only; the
// recompute replays what the forward stored, whatever the policy would answer now.
TEST_F(ReplayTest, RecomputeReplaysTheForwardsDecisions) {
  int64_t asked_in_recompute = 0;
  Invocation inv(functionPolicy([&](const OpContext& ctx) {
    if (ctx.is_recompute) ++asked_in_recompute;
    return ctx.is_recompute ? CheckpointPolicy::MUST_RECOMPUTE : CheckpointPolicy::MUST_SAVE;
  }));
  const at::Tensor a = at::randn({3, 3});
  at::Tensor forward, recompute;
  {
    RegionGuard region(inv, Phase::kForward);
    forward = callCountedMm(a, a);
  }
  {
    RegionGuard region(inv, Phase::kRecompute);
    recompute = callCountedMm(a, a);
  }
  EXPECT_EQ(asked_in_recompute, 0);
  EXPECT_EQ(counted_mm_calls, 1);  // served: the kernel ran in the forward only
  EXPECT_EQ(inv.stats().served, 1);
  EXPECT_TRUE(at::equal(forward, recompute));
}

// A recompute that completes without asking for a saved entry: released, counted, reported once.
TEST_F(ReplayTest, EntriesNoRecomputeAskedForAreReleasedAndReported) {
  Invocation inv(saveListPolicy({"hpac_test::counted_mm"}));
  const at::Tensor a = at::randn({16, 16});
  forwardTwoCountedMms(inv, a);
  EXPECT_EQ(inv.storedEntries(), 2u);
  CapturedWarnings warnings;
  {
    RegionGuard region(inv, Phase::kRecompute);
    callCountedMm(a, a);
  }
  EXPECT_EQ(inv.storedEntries(), 0u);
  EXPECT_EQ(inv.storedBytes(), 0);
  EXPECT_EQ(inv.stats().unserved, 1);
  EXPECT_EQ(inv.stats().unserved_bytes, 16 * 16 * 4);
  ASSERT_EQ(warnings.messages.size(), 1u);
  EXPECT_NE(warnings.messages[0].find("completed without asking for 1 saved output(s) (1024 bytes): "
                                      "hpac_test::counted_mm (default overload) occurrence 1"),
            std::string::npos)
      << warnings.messages[0];
}

// torch.utils.checkpoint stops a recompute early by an exception once backward has what it needs: no report then.
TEST_F(ReplayTest, ARecomputeEndedByAnExceptionReleasesSilently) {
  Invocation inv(saveListPolicy({"hpac_test::counted_mm"}));
  const at::Tensor a = at::randn({4, 4});
  forwardTwoCountedMms(inv, a);
  CapturedWarnings warnings;
  try {
    RegionGuard region(inv, Phase::kRecompute);
    callCountedMm(a, a);
    throw std::runtime_error("stop recomputation");
  } catch (const std::runtime_error&) {
  }
  {
    Invocation inv2(saveListPolicy({"hpac_test::counted_mm"}));
    {
      RegionGuard region(inv2, Phase::kForward);
      callCountedMm(a, a);
    }
    {
      RegionGuard region(inv2, Phase::kRecompute);
      region.abandon();  // as Python's context manager does when an exception passes through it
    }
    EXPECT_EQ(inv2.stats().unserved, 1);
  }
  EXPECT_EQ(inv.stats().unserved, 1);
  EXPECT_EQ(inv.storedEntries(), 0u);
  EXPECT_TRUE(warnings.messages.empty()) << warnings.messages[0];
}

TEST_F(ReplayTest, MutatedCacheIsAnErrorUnlessAllowed) {
  const at::Tensor a = at::randn({3, 3});
  {  // a write inside the region: hpac sees it coming and keeps a private copy (Note [Copy on write])
    Invocation inv(saveListPolicy({"hpac_test::counted_mm"}));
    at::Tensor original;
    {
      RegionGuard region(inv, Phase::kForward);
      at::Tensor out = callCountedMm(a, a);
      original = out.clone();
      out.add_(1);
    }
    at::Tensor served;
    {
      RegionGuard region(inv, Phase::kRecompute);
      served = callCountedMm(a, a);
    }
    EXPECT_TRUE(Matches({served}, {original}));
    EXPECT_EQ(counted_mm_calls, 1);  // still served, not recomputed
  }
  {  // a write after the region, which hpac does not see: refused at serve time
    Invocation inv(saveListPolicy({"hpac_test::counted_mm"}));
    at::Tensor out;
    {
      RegionGuard region(inv, Phase::kForward);
      out = callCountedMm(a, a);
    }
    out.add_(1);
    RegionGuard region(inv, Phase::kRecompute);
    const std::string msg = errorMessageOf([&] { callCountedMm(a, a); });
    EXPECT_NE(msg.find("was modified in place after it was saved"), std::string::npos) << msg;
    EXPECT_NE(msg.find("hpac_test::counted_mm"), std::string::npos) << msg;
  }
  {  // allowed: outputs are cloned at save
    Invocation inv(saveListPolicy({"hpac_test::counted_mm"}), InvocationOptions{/*allow_cache_mutation=*/true, nullptr});
    at::Tensor out, original;
    {
      RegionGuard region(inv, Phase::kForward);
      out = callCountedMm(a, a);
      original = out.clone();
    }
    out.add_(1);
    at::Tensor served;
    {
      RegionGuard region(inv, Phase::kRecompute);
      served = callCountedMm(a, a);
    }
    EXPECT_TRUE(Matches({served}, {original}));  // the clone taken at save time
  }
}

TEST_F(ReplayTest, InPlaceSavedOpGivesTheRecomputeItsContents) {
  Invocation inv(saveListPolicy({"aten::add_.Tensor"}));
  // Both targets are made inside the region: a write to a tensor from outside
  // it is a state write, never saved (Note [State written twice]).
  const at::Tensor b = at::randn({4});
  at::Tensor fwd;
  {
    RegionGuard region(inv, Phase::kForward);
    fwd = at::zeros({4});
    fwd.add_(b);
  }
  const at::Tensor other = at::zeros({4});
  at::Tensor rec, returned;
  {
    RegionGuard region(inv, Phase::kRecompute);
    rec = at::zeros({4});
    returned = rec.add_(other);  // kernel skipped: the forward's result is written into rec
  }
  EXPECT_TRUE(Matches({rec}, {fwd}));
  EXPECT_EQ(returned.unsafeGetTensorImpl(), rec.unsafeGetTensorImpl());
  EXPECT_EQ(inv.stats().served, 1);
}


// The kernel matmul folds a 3-D @ 2-D product into: mm (torch 1.13) or bmm (2.x).
const std::vector<std::string> kMatmulKernels = {"aten::bmm", "aten::mm"};

// Note [Copy on write] / [Unsafe aliases]: matmul on a non-contiguous 3-D input
// is mm + _unsafe_view on torch 1.13 and expand + bmm + _unsafe_view on 2.13
// (both are saved here); add_ on the result writes into the cached output
// without touching its version counter. Inside the region hpac sees the write
// coming and keeps a private copy; a write it cannot see (after the region)
// is refused at serve time. Never silently wrong.
TEST(Replay, WritesInsideTheRegionThroughUnsafeViewsCopyOnWrite) {
  at::manual_seed(0);
  const at::Tensor x = at::randn({3, 2, 8}), w = at::randn({8, 8});
  Invocation inv(saveListPolicy(kMatmulKernels));
  auto fn = [&] {
    at::Tensor y = at::matmul(x.transpose(0, 1), w);
    y.add_(1.0);
    return y;
  };
  at::Tensor fwd, rec;
  {
    RegionGuard region(inv, Phase::kForward);
    fwd = fn();
  }
  {
    RegionGuard region(inv, Phase::kRecompute);
    rec = fn();
  }
  EXPECT_EQ(inv.stats().served, 1);
  EXPECT_TRUE(Matches({fwd}, {rec}));  // served the mm output as produced, then add_ again: the same result
}

TEST(Replay, WritesAfterTheRegionThroughUnsafeViewsAreCaught) {
  at::manual_seed(0);
  const at::Tensor x = at::randn({3, 2, 8}), w = at::randn({8, 8});
  Invocation inv(saveListPolicy(kMatmulKernels));
  at::Tensor y;
  {
    RegionGuard region(inv, Phase::kForward);
    y = at::matmul(x.transpose(0, 1), w);
  }
  y.add_(1.0);  // user code after the region: hpac does not see the write itself
  RegionGuard region(inv, Phase::kRecompute);
  const std::string msg = errorMessageOf([&] { at::matmul(x.transpose(0, 1), w); });
  EXPECT_TRUE(msg.find("the cached output of aten::mm (default overload) occurrence 0") != std::string::npos ||
              msg.find("the cached output of aten::bmm (default overload) occurrence 0") != std::string::npos)
      << msg;
  EXPECT_NE(msg.find("was modified in place after it was saved"), std::string::npos) << msg;
}

// Note [Views are recomputed]: a save list (or a budget plan) that names a
// view is not obeyed for it: the view is recomputed from the served base, so
// a write through an alias in the recompute reaches both, as in the forward.
TEST(Replay, SavedViewsAreRecomputedFromTheirServedBase) {
  at::manual_seed(0);
  const at::Tensor x = at::randn({4, 8}), w = at::randn({8, 4});
  Invocation inv(saveListPolicy({"aten::mm", "aten::t", "aten::_unsafe_view"}));
  auto fn = [&] {
    at::Tensor a = at::mm(x, w);
    at::Tensor b = a.t();
    at::_unsafe_view(a, {16}).add_(1.0);
    return a.tanh() + b.t();
  };
  at::Tensor fwd, rec;
  {
    RegionGuard region(inv, Phase::kForward);
    fwd = fn();
  }
  {
    RegionGuard region(inv, Phase::kRecompute);
    rec = fn();
  }
  EXPECT_EQ(inv.stats().saved, 1);   // mm only
  EXPECT_EQ(inv.stats().served, 1);
  EXPECT_TRUE(Matches({fwd}, {rec}));
}

TEST(Replay, UnsafeViewsWithoutWritesServeNormally) {
  at::manual_seed(0);
  const at::Tensor x = at::randn({3, 2, 8}), w = at::randn({8, 8});
  Invocation inv(saveListPolicy(kMatmulKernels));
  at::Tensor fwd, rec;
  {
    RegionGuard region(inv, Phase::kForward);
    fwd = at::matmul(x.transpose(0, 1), w).tanh();
  }
  {
    RegionGuard region(inv, Phase::kRecompute);
    rec = at::matmul(x.transpose(0, 1), w).tanh();
  }
  EXPECT_EQ(inv.stats().served, 1);
  EXPECT_TRUE(Matches({fwd}, {rec}));
}

}  // namespace
}  // namespace hpac
