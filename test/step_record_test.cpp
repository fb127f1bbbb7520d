// policy/step_record.h and policy/json_value.h: the step record written and read back as the same record; version 1
// plan files converted; everything else refused naming the key and what is allowed.
#include "policy/step_record.h"

#include <c10/util/Exception.h>
#include <gtest/gtest.h>

namespace hpac {
namespace {

StepRecord sample() {
  StepRecord r;
  r.target_bytes = 3 << 20;
  r.predicted_bytes = (3 << 20) - 100;
  r.predicted_event = "backward of layer 1";
  r.planned_at_step = 2;
  r.margin_bytes = 7;
  r.measured_bytes = (3 << 20) - 200;
  r.measured_event = "after the layers";
  LayerPlan a;
  a.path = "model.layers.0";
  a.budget_bytes = 1000;
  a.kept_bytes = 900;
  a.forward_bytes = 1200;
  a.backward_bytes = 10;
  a.off_bytes = 4000;
  a.recompute_micros = 12.5;
  a.ops = parseJson("{\"saved\": 3, \"recomputed\": 9, \"served\": 3}", "test");
  LayerPlan b;
  b.path = "model.layers.1";
  b.checkpointed = false;
  b.budget_bytes = b.kept_bytes = b.off_bytes = 4000;
  b.forward_bytes = 4100;
  r.layers = {a, b};
  r.events = {{"before the layers", 10}, {"the rest", -5}};
  MeasuredStep first, second;
  first.step = 1;
  first.measured_bytes = 100;
  first.measured_event = "the rest";
  second.step = 2;
  second.measured_bytes = 99;
  second.measured_event = "after the layers";
  second.planned = true;
  second.predicted_bytes = 98;
  second.predicted_event = "x";
  second.fragmentation_bytes = 1;
  r.history = {first, second};
  r.context = {{"dtype", JsonValue::string("float32")}, {"world_size", JsonValue::number(int64_t{8})}};
  return r;
}

TEST(StepRecord, WrittenAndReadBackIsTheSameRecord) {
  const std::string text = stepRecordJson(sample());
  const StepRecord back = readStepRecord(text, "t.json");
  EXPECT_EQ(stepRecordJson(back), text);
  EXPECT_EQ(back.layers.at(0).path, "model.layers.0");
  EXPECT_DOUBLE_EQ(back.recomputeMicros(), 12.5);  // the checkpointed layers only
  EXPECT_EQ(back.history.at(1).predicted_bytes, 98);
  EXPECT_EQ(back.context.at(1).second.asInt(), 8);
  EXPECT_NE(text.find("\"format\": \"hpac-step-plan 2\""), std::string::npos) << text;
}

TEST(StepRecord, AVersion1PlanIsReadWithVersion2Names) {
  const std::string v1 =
      "{\"format\": \"hpac-step-plan 1\", \"memory_target_bytes\": 1000, \"predicted_bytes\": 900, "
      "\"predicted_event\": \"the rest\", \"meta_measured_bytes\": 950, \"meta_measured_event\": \"the rest\", "
      "\"recompute_micros\": 3.0, \"layers\": [{\"path\": \"l0\", \"checkpointed\": true, \"budget_bytes\": 1, "
      "\"kept_bytes\": 1, \"backward_bytes\": 0, \"forward_bytes\": 1, \"off_bytes\": 2, \"recompute_micros\": 3.0}], "
      "\"events\": {\"the rest\": 5}, \"dtype\": \"float32\"}";
  const StepRecord r = readStepRecord(v1, "old.json");
  EXPECT_EQ(r.target_bytes, 1000);
  EXPECT_EQ(r.measured_bytes, 950);
  EXPECT_EQ(r.context.at(0).first, "dtype");
}

std::string readError(const std::string& text) {
  try {
    readStepRecord(text, "p.json");
  } catch (const c10::Error& e) {
    return e.what_without_backtrace();
  }
  return "";
}

TEST(StepRecord, RefusesWhatItCannotReadNamingTheKey) {
  std::string good = stepRecordJson(sample());
  const std::pair<std::string, std::string> bad[] = {
      {"[1]", "the document is an array, not an object"},
      {"{\"format\": \"hpac-step-plan 0\"}", "format is 'hpac-step-plan 0'"},
      {"{\"format\": \"hpac-budget-plan 1\"}", "format is 'hpac-budget-plan 1'"},
      {"{", "not JSON at line 1, column 2"},
      {good.substr(0, good.size() - 1), "not JSON"},
  };
  for (const auto& [text, what] : bad) EXPECT_NE(readError(text).find(what), std::string::npos) << readError(text);
  std::string neg = good;
  neg.replace(neg.find("\"kept_bytes\": 900"), 17, "\"kept_bytes\": -1");
  EXPECT_NE(readError(neg).find("layers[0].kept_bytes is -1, below 0"), std::string::npos) << readError(neg);
  std::string str = good;
  str.replace(str.find("\"target_bytes\": 3145728"), 23, "\"target_bytes\": \"3MiB\"");
  EXPECT_NE(readError(str).find("target_bytes is a string, not an integer"), std::string::npos) << readError(str);
  EXPECT_TRUE(readError(good).empty());
}

TEST(JsonValue, KeepsNumbersAndOrderAndDecodesEscapes) {
  const JsonValue v = parseJson("{\"b\": 9007199254740993, \"a\": [1.50, -0e0, \"\\u00b5s\\ud83d\\ude00\"]}", "t");
  EXPECT_EQ(v.dump(), "{\"b\": 9007199254740993, \"a\": [1.50, -0e0, \"µs😀\"]}");
  EXPECT_EQ(v.find("b")->asInt(), 9007199254740993LL);
  for (const char* bad : {"", "01", "1.", "[1,]", "{\"a\" 1}", "\"\\x\"", "\"\\ud800\"", "{\"a\": 1, \"a\": 2}",
                          "1e999", "[1] 2", "\"a\nb\""}) {
    EXPECT_THROW(parseJson(bad, "t"), c10::Error) << bad;
  }
  EXPECT_THROW(parseJson(std::string(70, '[') + std::string(70, ']'), "t"), c10::Error);
}

}  // namespace
}  // namespace hpac
