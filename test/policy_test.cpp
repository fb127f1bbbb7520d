// Policy: table data, resolution, every rule of the selective policy, the
// per-phase alternation, save lists, bool adapter, ignored ops.
#include "policy/checkpoint_policy.h"
#include "policy/op_tables.h"
#include "policy/selective_policy.h"
#include "policy/traced_policy.h"
#include "policy/budget_policy.h"
#include "replay/invocation.h"
#include "replay/region.h"

#include "replay/torch_compat.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <torch/library.h>

#include <algorithm>

#include <iostream>
#include <string>

namespace hpac {
namespace {

c10::OperatorHandle handle(const char* name, const char* overload = "") {
  auto h = c10::Dispatcher::singleton().findSchema({name, overload});
  EXPECT_TRUE(h.has_value()) << name << "." << overload;
  return *h;
}

CheckpointPolicy decide(Policy& p, const c10::OperatorHandle& op, bool recompute = false) {
  return p.decide(OpContext{recompute, 1, op, 0, {}});
}

TEST(OpTables, EveryTableIsSortedAndUnique) {
  for (auto table : {ignoredOps(), recomputeOps(), matmulOps(), saveOps()}) {
    for (size_t i = 1; i < table.size(); ++i) {
      EXPECT_LT(std::string(table[i - 1].name), std::string(table[i].name)) << "table entry " << i;
    }
  }
}

TEST(OpTables, ResolvesEveryEntryAndListsMissingOptionalOnes) {
  const ResolvedOpTables tables;  // throws if a required entry is missing
  EXPECT_GT(tables.resolvedCount(), 20u);
  std::cout << "optional op table entries this libtorch lacks (" << tables.missingOptional().size() << "):";
  for (const auto& name : tables.missingOptional()) std::cout << " " << name;
  std::cout << "\n";
  // Every required entry resolves to at least one handle.
  for (auto table : {ignoredOps(), recomputeOps(), matmulOps(), saveOps()}) {
    for (const OpEntry& e : table) {
      if (!e.optional) {
        EXPECT_FALSE(resolveEntry(e.name).empty()) << e.name;
      }
    }
  }
}

// The optional entries a torch of this version must have: a renamed or removed
// op then fails here instead of silently leaving its table.
std::vector<std::string> optionalEntriesThisTorchHas() {
#if HPAC_TORCH_AT_LEAST(2, 0)
  return {"_c10d_functional::all_gather_into_tensor",
          "_c10d_functional::all_gather_into_tensor_coalesced",
          "_c10d_functional::all_reduce",
          "_c10d_functional::all_reduce_coalesced",
          "_c10d_functional::all_to_all_single",
          "_c10d_functional::reduce_scatter_tensor",
          "_c10d_functional::reduce_scatter_tensor_coalesced",
          "_c10d_functional::wait_tensor",
          "aten::_chunk_cat",
          "aten::_efficient_attention_forward",
          "aten::_grouped_mm",
          "aten::_scaled_dot_product_attention_math",
          "aten::_scaled_dot_product_cudnn_attention",
          "aten::_scaled_dot_product_efficient_attention",
          "aten::_scaled_dot_product_flash_attention",
          "aten::_scaled_dot_product_flash_attention_for_cpu",
          "aten::_scaled_grouped_mm",
          "aten::_scaled_mm",
          "aten::split_with_sizes_copy",
          "c10d::_allgather_base_",
          "c10d::allreduce_",
          "c10d::alltoall_base_",
          "c10d::recv_",
          "c10d::send",
          "profiler::_record_function_enter_new",
          "profiler::_record_function_exit"};
#else
  return {"aten::_flash_scaled_dot_product_attention", "c10d::allreduce_", "c10d::alltoall_", "c10d::recv_",
          "c10d::send", "profiler::_record_function_enter", "profiler::_record_function_exit"};
#endif
}

TEST(OpTables, OptionalEntriesOfThisTorchResolve) {
  const ResolvedOpTables tables;
  std::cout << "torch " << HPAC_TORCH_VERSION << ": optional entries resolved:";
  for (auto table : {ignoredOps(), recomputeOps(), matmulOps(), saveOps()}) {
    for (const OpEntry& e : table) {
      if (e.optional && !resolveEntry(e.name).empty()) std::cout << " " << e.name;
    }
  }
  std::cout << "\n";
  for (const std::string& name : optionalEntriesThisTorchHas()) {
    const auto handles = resolveEntry(name);
    EXPECT_FALSE(handles.empty()) << name << " is expected on torch " << HPAC_TORCH_VERSION;
    EXPECT_EQ(std::count(tables.missingOptional().begin(), tables.missingOptional().end(), name), 0) << name;
    // The tables themselves must hold it: a misspelled table entry resolves nothing and leaves the op unclassified.
    for (const auto& h : handles) {
      EXPECT_NE(tables.classify(h), OpCategory::kOther) << name << " exists on this torch but no table entry covers it";
    }
  }
}

// Note [Ops registered later]: an operator an optional entry names, registered
// after the tables were first resolved, is in the tables the next call returns.
TEST(OpTables, AnOpRegisteredLaterEntersTheTables) {
  const c10::OperatorName later{"fsdp::all_gather_copy_in", ""};
  if (c10::Dispatcher::singleton().findSchema(later)) GTEST_SKIP() << "fsdp::all_gather_copy_in already registered";
  const ResolvedOpTables& before = ResolvedOpTables::global();
  const int64_t resolutions = ResolvedOpTables::resolutions();
  EXPECT_EQ(&ResolvedOpTables::global(), &before);  // nothing registered: no new resolution
  {
    torch::Library lib(torch::Library::FRAGMENT, "fsdp", c10::nullopt, __FILE__, __LINE__);
    lib.def("all_gather_copy_in(Tensor x) -> Tensor");
    const ResolvedOpTables& after = ResolvedOpTables::global();
    EXPECT_EQ(ResolvedOpTables::resolutions(), resolutions + 1);
    EXPECT_EQ(after.classify(*c10::Dispatcher::singleton().findSchema(later)), OpCategory::kIgnored);
    EXPECT_EQ(before.missingOptional().size(), after.missingOptional().size() + 1);
  }
  // Deregistered again (the Library went away): resolved once more, without it.
  EXPECT_EQ(ResolvedOpTables::global().missingOptional().size(), before.missingOptional().size());
}

TEST(OpTables, EntrySyntax) {
  EXPECT_GE(resolveEntry("aten::max").size(), 4u);           // every overload
  EXPECT_EQ(resolveEntry("aten::max.dim").size(), 1u);       // one overload
  EXPECT_EQ(resolveEntry("aten::copy_.default").size(), 1u);  // the overload with the empty name
  EXPECT_TRUE(resolveEntry("aten::no_such_op").empty());
  EXPECT_THROW(resolveEntry("mm"), c10::Error);
  EXPECT_THROW(resolveEntry("aten::mm."), c10::Error);
  // Found by test/fuzz/op_name_fuzzer.cpp: a NUL cut the message short; such entries are refused, shown escaped.
  try {
    resolveEntry(std::string("aten::m\0m", 9));
    ADD_FAILURE() << "an entry holding a NUL was accepted";
  } catch (const c10::Error& e) {
    EXPECT_NE(std::string(e.what_without_backtrace()).find("'aten::m\\x00m' holds a byte that is not printable ASCII"),
              std::string::npos)
        << e.what_without_backtrace();
  }
}

TEST(OpTables, Classification) {
  const auto& t = ResolvedOpTables::global();
  EXPECT_EQ(t.classify(handle("aten::topk")), OpCategory::kRecompute);
  EXPECT_EQ(t.classify(handle("aten::mm")), OpCategory::kMatmul);
  EXPECT_EQ(t.classify(handle("aten::bmm")), OpCategory::kSave);
  EXPECT_EQ(t.classify(handle("aten::addmm")), OpCategory::kSave);
  EXPECT_EQ(t.classify(handle("aten::max", "dim")), OpCategory::kSave);
  EXPECT_EQ(t.classify(handle("aten::detach")), OpCategory::kIgnored);
  EXPECT_EQ(t.classify(handle("aten::view")), OpCategory::kIgnored);
  EXPECT_EQ(t.classify(handle("aten::view", "dtype")), OpCategory::kOther);  // only the default overload
  EXPECT_EQ(t.classify(handle("aten::empty", "memory_format")), OpCategory::kIgnored);
  EXPECT_EQ(t.classify(handle("aten::relu")), OpCategory::kOther);
}

TEST(SelectivePolicy, Rules) {
  SelectivePolicy p(ResolvedOpTables::global());
  EXPECT_EQ(decide(p, handle("aten::topk")), CheckpointPolicy::MUST_RECOMPUTE);
  EXPECT_EQ(decide(p, handle("aten::bmm")), CheckpointPolicy::MUST_SAVE);
  EXPECT_EQ(decide(p, handle("aten::addmm")), CheckpointPolicy::MUST_SAVE);
  EXPECT_EQ(decide(p, handle("aten::max")), CheckpointPolicy::MUST_SAVE);
  EXPECT_EQ(decide(p, handle("aten::_softmax")), CheckpointPolicy::MUST_RECOMPUTE);
  EXPECT_EQ(decide(p, handle("aten::index_add_")), CheckpointPolicy::MUST_RECOMPUTE);
}

TEST(SelectivePolicy, MatmulFamilyAlternatesPerPhase) {
  SelectivePolicy p(ResolvedOpTables::global());
  const auto mm = handle("aten::mm");
  // Forward: three matmuls (odd), interleaved with other ops.
  p.onPhaseBegin(false);
  EXPECT_EQ(decide(p, mm), CheckpointPolicy::MUST_SAVE);
  EXPECT_EQ(decide(p, handle("aten::relu")), CheckpointPolicy::MUST_RECOMPUTE);
  EXPECT_EQ(decide(p, mm), CheckpointPolicy::MUST_RECOMPUTE);
  EXPECT_EQ(decide(p, mm), CheckpointPolicy::MUST_SAVE);
  EXPECT_EQ(p.matmulCount(false), 3);
  // Recompute: its own counter starts at 0, so the decisions match the forward's.
  p.onPhaseBegin(true);
  EXPECT_EQ(decide(p, mm, true), CheckpointPolicy::MUST_SAVE);
  EXPECT_EQ(decide(p, mm, true), CheckpointPolicy::MUST_RECOMPUTE);
  EXPECT_EQ(decide(p, mm, true), CheckpointPolicy::MUST_SAVE);
  EXPECT_EQ(p.matmulCount(true), 3);
  EXPECT_EQ(p.matmulCount(false), 3);
}

TEST(SelectivePolicy, CountersArePerInvocation) {
  auto factory = selectivePolicy();
  auto a = factory();
  auto b = factory();
  const auto mm = handle("aten::mm");
  EXPECT_EQ(decide(*a, mm), CheckpointPolicy::MUST_SAVE);
  EXPECT_EQ(decide(*a, mm), CheckpointPolicy::MUST_RECOMPUTE);
  EXPECT_EQ(decide(*b, mm), CheckpointPolicy::MUST_SAVE);  // a fresh invocation starts at the 1st matmul
}

// The policy a compiled region's tags come from: the same rules as eager, one
// counter per traced region, ignored ops not counted, views never saved.
TEST(TracedPolicy, AsksThePolicyLikeAnEagerForward) {
  std::vector<std::pair<std::string, int64_t>> asked;  // (op, occurrence) as the policy saw them
  auto recording = functionPolicy([&](const OpContext& ctx) {
    asked.emplace_back(ctx.op.operator_name().name, ctx.occurrence);
    return ctx.op.operator_name().name == "aten::t" ? CheckpointPolicy::MUST_SAVE : CheckpointPolicy::PREFER_SAVE;
  });
  TracedPolicy traced(recording, /*save_routing=*/false, /*record_log=*/true);
  const auto mm = handle("aten::mm");
  EXPECT_EQ(traced.decide(mm), CheckpointPolicy::PREFER_SAVE);
  EXPECT_EQ(traced.decide(handle("aten::detach")), CheckpointPolicy::PREFER_RECOMPUTE);  // ignored table
  EXPECT_EQ(traced.decide(handle("aten::t")), CheckpointPolicy::MUST_RECOMPUTE);         // a view: never saved
  EXPECT_EQ(traced.decide(mm), CheckpointPolicy::PREFER_SAVE);
  EXPECT_EQ(traced.decideUnregistered("tag_activation_checkpoint"), CheckpointPolicy::PREFER_RECOMPUTE);
  const std::vector<std::pair<std::string, int64_t>> expected{{"aten::mm", 0}, {"aten::t", 0}, {"aten::mm", 1}};
  EXPECT_EQ(asked, expected);
  EXPECT_EQ(traced.counted(), 3);
  EXPECT_EQ(traced.ignored(), 1);
  EXPECT_EQ(traced.saved(), 2);
  const std::vector<std::string> log{"aten::mm PREFER_SAVE", "aten::detach ignored", "aten::t MUST_RECOMPUTE",
                                     "aten::mm PREFER_SAVE", "tag_activation_checkpoint unregistered"};
  EXPECT_EQ(traced.log(), log);
}

TEST(TracedPolicy, SelectiveAlternatesPerTracedRegion) {
  const auto mm = handle("aten::mm");
  TracedPolicy first(selectivePolicy());
  EXPECT_TRUE(first.log().empty());  // no log unless asked for: nothing grows per traced op
  EXPECT_EQ(first.decide(mm), CheckpointPolicy::MUST_SAVE);
  EXPECT_EQ(first.decide(mm), CheckpointPolicy::MUST_RECOMPUTE);
  EXPECT_EQ(first.decide(handle("aten::topk")), CheckpointPolicy::MUST_RECOMPUTE);
  TracedPolicy second(selectivePolicy());  // another checkpoint call: its own counter
  EXPECT_EQ(second.decide(mm), CheckpointPolicy::MUST_SAVE);
}

TEST(TracedPolicy, RefusesABudgetThatWouldProfile) {
  auto region = std::make_shared<BudgetRegion>(makeBudgetSpec(0.5, std::nullopt, 1, 2));
  try {
    TracedPolicy traced(region->factory());
    FAIL() << "expected an error";
  } catch (const c10::Error& e) {
    EXPECT_NE(std::string(e.what()).find("activation_memory_budget"), std::string::npos) << e.what();
  }
}

TEST(PolicyAdapters, BoolAndSaveList) {
  auto by_bool = boolPolicy([](const OpContext& ctx) { return ctx.op.operator_name().name == "aten::relu"; })();
  EXPECT_EQ(decide(*by_bool, handle("aten::relu")), CheckpointPolicy::MUST_SAVE);
  EXPECT_EQ(decide(*by_bool, handle("aten::mm")), CheckpointPolicy::PREFER_RECOMPUTE);

  auto list = saveListPolicy({"aten::mm", "aten::max.dim"})();
  EXPECT_EQ(decide(*list, handle("aten::mm")), CheckpointPolicy::MUST_SAVE);
  EXPECT_EQ(decide(*list, handle("aten::max", "dim")), CheckpointPolicy::MUST_SAVE);
  EXPECT_EQ(decide(*list, handle("aten::max")), CheckpointPolicy::PREFER_RECOMPUTE);
  EXPECT_EQ(decide(*list, handle("aten::bmm")), CheckpointPolicy::PREFER_RECOMPUTE);

  try {
    saveListPolicy({"aten::mmm"});
    FAIL() << "expected an error";
  } catch (const c10::Error& e) {
    EXPECT_NE(std::string(e.what()).find("'aten::mmm'"), std::string::npos) << e.what();
  }
}

TEST(PolicyAdapters, RecomputeAll) {
  auto p = recomputeAllPolicy()();
  EXPECT_FALSE(isSave(decide(*p, handle("aten::bmm"))));
}

TEST(IgnoredOps, AreNotCountedAndReachNoPolicy) {
  int64_t policy_calls = 0;
  Invocation inv(functionPolicy([&](const OpContext& ctx) {
    ++policy_calls;
    return CheckpointPolicy::PREFER_RECOMPUTE;
  }));
  const at::Tensor x = at::randn({4, 4});
  {
    RegionGuard region(inv, Phase::kForward);
    at::Tensor d = x.detach();                // ignored
    at::Tensor v = x.view({16});              // ignored (aten::view, default overload)
    at::Tensor e = at::empty({3});            // ignored (empty.memory_format)
    at::Tensor r = at::relu(x);               // counted
  }
  EXPECT_EQ(inv.stats().ignored, 3);
  EXPECT_EQ(inv.stats().ops_forward, 1);
  EXPECT_EQ(policy_calls, 1);
}

}  // namespace
}  // namespace hpac
