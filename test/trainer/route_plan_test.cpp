// The route planner (tools/trainer/route_plan.h) on the table of cases both
// front ends' tests read (test/trainer/route_cases.json; its Python twin is
// test/python/hf/test_route_plan.py): facts in, the plan the rules ask for out.
#include "test/support/source_dir.h"
#include "tools/trainer/route_plan.h"
#include "tools/trainer/route_plan_json.h"

#include <gtest/gtest.h>
#include <yaml-cpp/yaml.h>

#include <string>
#include <vector>

namespace hpac::trainer {
namespace {

const YAML::Node& cases() {
  static const YAML::Node table = YAML::LoadFile(sourcePath("test/trainer/route_cases.json"))["cases"];
  return table;
}

std::string levelName(LogLevel level) { return level == LogLevel::kWarning ? "warning" : "info"; }

// Each [level, substring] of `expected` found in the plan's messages, in order.
void expectMessages(const RoutePlan& plan, const YAML::Node& expected) {
  if (expected.size() == 0) {
    EXPECT_TRUE(plan.messages.empty());
  }
  size_t at = 0;
  for (const YAML::Node& m : expected) {
    const std::string level = m[0].as<std::string>(), text = m[1].as<std::string>();
    while (at < plan.messages.size() &&
           (levelName(plan.messages[at].first) != level || plan.messages[at].second.find(text) == std::string::npos)) {
      ++at;
    }
    EXPECT_LT(at, plan.messages.size()) << "no " << level << " message containing '" << text << "' (in order)";
    ++at;
  }
}

void expectLayers(const RoutePlan& plan, const YAML::Node& expected) {
  ASSERT_EQ(plan.layers.size(), expected.size());
  for (size_t i = 0; i < plan.layers.size(); ++i) {
    const LayerRoute& l = plan.layers[i];
    EXPECT_EQ(toString(l.mode), expected[i][0].as<std::string>()) << "layer " << i;
    EXPECT_EQ(toString(l.layer), expected[i][1].as<std::string>()) << "layer " << i;
    EXPECT_EQ(l.native, expected[i][2].as<bool>()) << "layer " << i;
    EXPECT_EQ(l.submodules, expected[i][3].as<std::vector<std::string>>()) << "layer " << i;
  }
}

void expectPlan(const RoutePlan& plan, const YAML::Node& e) {
  if (e["needs_model"]) {
    EXPECT_EQ(plan.needs_model, e["needs_model"].as<bool>());
  }
  if (e["touched"]) {
    EXPECT_EQ(plan.touched, e["touched"].as<bool>());
  }
  if (e["kv_sharing"]) {
    EXPECT_EQ(plan.kv_sharing, e["kv_sharing"].as<bool>());
  }
  if (e["use_cache_off"]) {
    EXPECT_EQ(plan.use_cache_off, e["use_cache_off"].as<std::vector<std::string>>());
  }
  if (e["full_route"]) {
    EXPECT_EQ(plan.full_route ? std::string(toString(*plan.full_route)) : "null",
              e["full_route"].IsNull() ? "null" : e["full_route"].as<std::string>());
  }
  if (e["full_route_reason"]) {
    EXPECT_EQ(plan.full_route_reason, e["full_route_reason"].as<std::string>());
  }
  if (e["layers_wrapped"]) {
    EXPECT_EQ(plan.layers_wrapped, e["layers_wrapped"].as<int64_t>());
  }
  if (e["submodules_wrapped"]) {
    EXPECT_EQ(plan.submodules_wrapped, e["submodules_wrapped"].as<int64_t>());
  }
  if (e["layers"]) expectLayers(plan, e["layers"]);
  if (e["messages"]) expectMessages(plan, e["messages"]);
}

TEST(RoutePlan, TheTableHasCases) { EXPECT_GE(cases().size(), 20u); }

TEST(RoutePlan, EveryCaseOfTheTable) {
  for (const YAML::Node& c : cases()) {
    SCOPED_TRACE(c["name"].as<std::string>());
    auto facts = routeFactsFromJson(YAML::Dump(c["facts"]));
    ASSERT_TRUE(facts.ok()) << facts.status().message();
    auto plan = planRoutes(*facts);
    const YAML::Node& e = c["expect"];
    if (e["error"]) {
      ASSERT_FALSE(plan.ok()) << "planned although the rules refuse it";
      EXPECT_NE(std::string(plan.status().message()).find(e["error"].as<std::string>()), std::string::npos)
          << plan.status().message();
      continue;
    }
    ASSERT_TRUE(plan.ok()) << plan.status().message();
    expectPlan(*plan, e);
  }
}

TEST(RoutePlan, FactsThatAreNotFactsNameTheKey) {
  auto missing = routeFactsFromJson(R"({"file": "t.yaml", "activation_checkpoint": {"mode": "full", "layers": []},
      "activation_swap": "none", "compile": false, "compiles_layers": false, "aliases": {"mlp": [], "attention": [],
      "norm1": [], "norm2": [], "mtp": []}, "model": {"class_name": "M"}})");
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.status().message(), "route facts: model.how: missing");
  auto bad_mode = routeFactsFromJson(R"({"file": "t", "activation_checkpoint": {"mode": "fast", "layers": []}})");
  ASSERT_FALSE(bad_mode.ok());
  EXPECT_EQ(bad_mode.status().message(), "route facts: activation_checkpoint.mode: 'fast' is not a mode");
  EXPECT_FALSE(routeFactsFromJson("{not json").ok());
}

TEST(RoutePlan, ThePlanAsJsonCarriesEveryDecision) {
  RoutePlan plan;
  plan.touched = true;
  plan.full_route = FullRoute::kCompile;
  plan.full_route_reason = "compile is on";
  plan.use_cache_off = {"config"};
  LayerRoute l;
  l.path = "model.layers.0";
  l.mode = CheckpointMode::kFull;
  l.submodules = {"self_attn", "mlp"};
  plan.layers.push_back(l);
  plan.submodules_wrapped = 2;
  plan.messages.emplace_back(LogLevel::kWarning, "say \"so\"");
  const YAML::Node j = YAML::Load(routePlanJson(plan));
  EXPECT_FALSE(j["needs_model"].as<bool>());
  EXPECT_TRUE(j["touched"].as<bool>());
  EXPECT_EQ(j["full_route"].as<std::string>(), "compile");
  EXPECT_EQ(j["use_cache_off"][0].as<std::string>(), "config");
  EXPECT_EQ(j["layers"][0]["layer"].as<std::string>(), "off");
  EXPECT_EQ(j["layers"][0]["submodules"][1].as<std::string>(), "mlp");
  EXPECT_EQ(j["submodules_wrapped"].as<int64_t>(), 2);
  EXPECT_EQ(j["messages"][0][0].as<std::string>(), "warning");
  EXPECT_EQ(j["messages"][0][1].as<std::string>(), "say \"so\"");
}

}  // namespace
}  // namespace hpac::trainer
