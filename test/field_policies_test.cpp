// Field policies (policy/field_policies.h): torchtitan's SelectiveAC rule by
// rule, save_all_but, occurrence patterns and their errors, the kinds that name them.
#include "policy/field_policies.h"
#include "policy/op_tables.h"
#include "policy/policy_kind.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace hpac {
namespace {

c10::OperatorHandle op(const char* name, const char* overload = "") {
  auto h = c10::Dispatcher::singleton().findSchema({name, overload});
  EXPECT_TRUE(h.has_value()) << name << "." << overload;
  return *h;
}

CheckpointPolicy decide(Policy& p, const c10::OperatorHandle& h, int64_t occurrence = 0,
                        std::vector<c10::IValue> args = {}) {
  return p.decide(OpContext{false, 1, h, occurrence, args});
}

std::string errorOf(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const c10::Error& e) {
    return e.what_without_backtrace();
  }
  return "";
}

TEST(FieldPolicies, TorchtitanTablesAreSortedUniqueAndResolve) {
  for (auto table : {torchtitanSaveOps(), torchtitanMatmulOps()}) {
    for (size_t i = 1; i < table.size(); ++i) {
      EXPECT_LT(std::string(table[i - 1].name), std::string(table[i].name)) << "table entry " << i;
    }
    for (const OpEntry& e : table) {
      if (!e.optional) EXPECT_FALSE(resolveEntry(e.name).empty()) << e.name;
    }
  }
}

TEST(FieldPolicies, TorchtitanEverySecondMatmulAndTheSaveSet) {
  auto p = torchtitanPolicy()();
  const auto mm = op("aten::mm");
  EXPECT_EQ(decide(*p, mm), CheckpointPolicy::MUST_SAVE);
  EXPECT_EQ(decide(*p, op("aten::linear")), CheckpointPolicy::PREFER_RECOMPUTE);  // one counter for both
  EXPECT_EQ(decide(*p, mm), CheckpointPolicy::MUST_SAVE);
  EXPECT_EQ(decide(*p, mm), CheckpointPolicy::PREFER_RECOMPUTE);
  EXPECT_EQ(decide(*p, op("aten::bmm")), CheckpointPolicy::MUST_SAVE);
  EXPECT_EQ(decide(*p, op("aten::topk")), CheckpointPolicy::MUST_SAVE);
  EXPECT_EQ(decide(*p, op("aten::max")), CheckpointPolicy::MUST_SAVE);
  EXPECT_EQ(decide(*p, op("aten::max", "dim")), CheckpointPolicy::PREFER_RECOMPUTE);  // .default only
  // Not among torch's compute_intensive_ops (torch >= 2.2 has it).
  if (auto cpu_sdpa = c10::Dispatcher::singleton().findSchema({"aten::_scaled_dot_product_flash_attention_for_cpu", ""})) {
    EXPECT_EQ(decide(*p, *cpu_sdpa), CheckpointPolicy::PREFER_RECOMPUTE);
  }
  EXPECT_EQ(decide(*p, op("aten::relu")), CheckpointPolicy::PREFER_RECOMPUTE);
  EXPECT_NE(p->reason().find("rule 5"), std::string::npos);
  p->onPhaseBegin(false);
  EXPECT_EQ(decide(*p, mm), CheckpointPolicy::MUST_SAVE);  // the counter starts again per phase
}

TEST(FieldPolicies, TorchtitanForcedShapesAreRecomputedAndNotCounted) {
  auto p = torchtitanPolicy({{16, 4}})();
  const auto x = at::zeros({3, 16});
  const auto mm = op("aten::mm");
  // mm's right-hand side (16, 4) matches; linear's weight (4, 16) is (out, in) and matches transposed.
  EXPECT_EQ(decide(*p, mm, 0, {x, at::zeros({16, 4})}), CheckpointPolicy::PREFER_RECOMPUTE);
  EXPECT_NE(p->reason().find("rule 2"), std::string::npos);
  EXPECT_EQ(decide(*p, op("aten::linear"), 0, {x, at::zeros({4, 16}), c10::IValue()}),
            CheckpointPolicy::PREFER_RECOMPUTE);
  EXPECT_EQ(decide(*p, mm, 1, {x, at::zeros({16, 8})}), CheckpointPolicy::MUST_SAVE);  // the 1st counted
  EXPECT_EQ(decide(*p, mm, 2, {x, at::zeros({4, 16})}), CheckpointPolicy::PREFER_RECOMPUTE);  // the 2nd
}

TEST(FieldPolicies, ShapesParseOrSayWhatIsAllowed) {
  EXPECT_EQ(parseMatmulShape("128x8", "t"), (MatmulShape{128, 8}));
  for (const char* bad : {"128", "x8", "128x", "12.5x8", "0x8", "-1x8", "8x8x8"}) {
    EXPECT_NE(errorOf([&] { parseMatmulShape(bad, "t"); }).find("is not allowed; allowed: 'INxOUT'"),
              std::string::npos) << bad;
  }
}

TEST(FieldPolicies, SaveAllButRecomputesTheListedOnly) {
  auto p = saveAllButPolicy({"aten::relu", "aten::mul.Tensor"})();
  EXPECT_EQ(decide(*p, op("aten::relu")), CheckpointPolicy::PREFER_RECOMPUTE);
  EXPECT_EQ(decide(*p, op("aten::mul", "Tensor")), CheckpointPolicy::PREFER_RECOMPUTE);
  EXPECT_EQ(decide(*p, op("aten::mul", "Scalar")), CheckpointPolicy::MUST_SAVE);
  EXPECT_EQ(decide(*p, op("aten::mm")), CheckpointPolicy::MUST_SAVE);
  EXPECT_NE(errorOf([] { saveAllButPolicy({"aten::no_such_op"}); }).find("save_all_but entry: 'aten::no_such_op'"),
            std::string::npos);
}

TEST(FieldPolicies, OccurrencePatternsSaveTheListedOccurrences) {
  auto p = occurrencePolicy({"aten::mm@0,3:5", "aten::bmm@1::2", "aten::mm@::10"})();
  const auto mm = op("aten::mm"), bmm = op("aten::bmm");
  std::vector<int64_t> saved_mm, saved_bmm;
  for (int64_t n = 0; n < 12; ++n) {
    if (isSave(decide(*p, mm, n))) saved_mm.push_back(n);
    if (isSave(decide(*p, bmm, n))) saved_bmm.push_back(n);
  }
  EXPECT_EQ(saved_mm, (std::vector<int64_t>{0, 3, 4, 10}));
  EXPECT_EQ(saved_bmm, (std::vector<int64_t>{1, 3, 5, 7, 9, 11}));
  EXPECT_EQ(decide(*p, op("aten::relu")), CheckpointPolicy::PREFER_RECOMPUTE);
}

TEST(FieldPolicies, OccurrencePatternErrorsSayWhatIsAllowed) {
  for (const char* bad : {"aten::mm", "aten::mm@", "@1", "aten::mm@x", "aten::mm@1,,2", "aten::mm@-1",
                          "aten::mm@::0", "aten::mm@1:2:3:4"}) {
    EXPECT_NE(errorOf([&] { occurrencePolicy({bad}); }).find("is not allowed; allowed: 'ns::op[.overload]@ITEMS'"),
              std::string::npos) << bad;
  }
  EXPECT_NE(errorOf([] { occurrencePolicy({"aten::nope@1"}); }).find("'aten::nope' names no operator"),
            std::string::npos);
}

TEST(FieldPolicies, KindsNameThemAndCheckTheirParameters) {
  EXPECT_EQ(parsePolicyKind("torchtitan", "t"), PolicyKind::kTorchtitan);
  EXPECT_EQ(parsePolicyKind("save_all_but", "t"), PolicyKind::kSaveAllBut);
  EXPECT_EQ(parsePolicyKind("save_occurrences", "t"), PolicyKind::kSaveOccurrences);
  EXPECT_NE(errorOf([] { parsePolicyKind("titan", "t"); }).find("allowed: full, selective, save_list, save_all, "
                                                                  "policy_fn, torchtitan, save_all_but, "
                                                                  "save_occurrences"),
            std::string::npos);
  EXPECT_TRUE(policyForKind(PolicyKind::kTorchtitan, {"8x4"}, "t"));
  EXPECT_NE(errorOf([] { policyForKind(PolicyKind::kTorchtitan, {"8"}, "t"); }).find("t: shape '8' is not allowed"),
            std::string::npos);
  EXPECT_NE(errorOf([] { policyForKind(PolicyKind::kSelective, {"8x4"}, "t"); }).find("takes no parameters"),
            std::string::npos);
}

}  // namespace
}  // namespace hpac
