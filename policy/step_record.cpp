#include "policy/step_record.h"

#include <c10/util/Exception.h>

#include <cstdint>
#include <set>

namespace hpac {

namespace {

// The keys StepTarget writes, besides "format"; everything else of a record is its context.
const std::set<std::string>& ownKeys() {
  static const std::set<std::string> keys = {"target_bytes", "predicted_bytes", "predicted_event", "planned_at_step",
                                             "margin_bytes", "error", "measured_bytes", "measured_event",
                                             "recompute_micros", "layers", "events", "history"};
  return keys;
}

JsonValue layerJson(const LayerPlan& p) {
  JsonValue v = JsonValue::object();
  v.set("path", JsonValue::string(p.path));
  v.set("checkpointed", JsonValue::boolean(p.checkpointed));
  v.set("budget_bytes", JsonValue::number(p.budget_bytes));
  v.set("kept_bytes", JsonValue::number(p.kept_bytes));
  v.set("backward_bytes", JsonValue::number(p.backward_bytes));
  v.set("forward_bytes", JsonValue::number(p.forward_bytes));
  v.set("off_bytes", JsonValue::number(p.off_bytes));
  v.set("recompute_micros", JsonValue::number(p.recompute_micros));
  if (p.ops.kind() != JsonValue::Kind::kNull) v.set("ops", p.ops);
  return v;
}

JsonValue historyJson(const MeasuredStep& r, int64_t target_bytes) {
  JsonValue v = JsonValue::object();
  v.set("step", JsonValue::number(r.step));
  v.set("measured_bytes", JsonValue::number(r.measured_bytes));
  v.set("measured_event", JsonValue::string(r.measured_event));
  v.set("planned", JsonValue::boolean(r.planned));
  if (r.planned) {
    v.set("predicted_bytes", JsonValue::number(r.predicted_bytes));
    v.set("predicted_event", JsonValue::string(r.predicted_event));
    v.set("target_bytes", JsonValue::number(target_bytes));
    v.set("fragmentation_bytes", JsonValue::number(r.fragmentation_bytes));
  }
  return v;
}

// Reads one record's fields, each error naming the source and the key's path.
class Reader {
 public:
  explicit Reader(std::string source) : source_(std::move(source)) {}

  [[noreturn]] void fail(const std::string& key, const std::string& what) const {
    TORCH_CHECK(false, "hpac: step record ", source_, ": ", key, " ", what, "; allowed: a record written by ",
                "`python -m hpac plan --out FILE` (", kStepRecordFormat, ", or hpac-step-plan 1)");
  }
  const JsonValue& get(const JsonValue& o, const std::string& key, const std::string& where) const {
    const JsonValue* v = o.find(key);
    if (v == nullptr) fail(where + key, "is missing");
    return *v;
  }
  int64_t integer(const JsonValue& o, const std::string& key, const std::string& where, int64_t least) const {
    const JsonValue& v = get(o, key, where);
    if (!v.isInteger()) fail(where + key, std::string("is ") + v.kindName() + ", not an integer");
    if (v.asInt() < least) fail(where + key, "is " + v.dump() + ", below " + std::to_string(least));
    return v.asInt();
  }
  double real(const JsonValue& o, const std::string& key, const std::string& where) const {
    const JsonValue& v = get(o, key, where);
    if (v.kind() != JsonValue::Kind::kNumber) fail(where + key, std::string("is ") + v.kindName() + ", not a number");
    return v.asDouble();
  }
  std::string text(const JsonValue& o, const std::string& key, const std::string& where) const {
    const JsonValue& v = get(o, key, where);
    if (v.kind() != JsonValue::Kind::kString) fail(where + key, std::string("is ") + v.kindName() + ", not a string");
    return v.asString();
  }
  bool flag(const JsonValue& o, const std::string& key, const std::string& where) const {
    const JsonValue& v = get(o, key, where);
    if (v.kind() != JsonValue::Kind::kBool) fail(where + key, std::string("is ") + v.kindName() + ", not a boolean");
    return v.asBool();
  }
  const JsonValue& list(const JsonValue& o, const std::string& key, const std::string& where) const {
    const JsonValue& v = get(o, key, where);
    if (v.kind() != JsonValue::Kind::kArray) fail(where + key, std::string("is ") + v.kindName() + ", not an array");
    return v;
  }
  void object(const JsonValue& v, const std::string& where) const {
    if (v.kind() != JsonValue::Kind::kObject) fail(where, std::string("is ") + v.kindName() + ", not an object");
  }

  LayerPlan layer(const JsonValue& v, const std::string& where) const {
    object(v, where);
    LayerPlan p;
    p.path = text(v, "path", where + ".");
    p.checkpointed = flag(v, "checkpointed", where + ".");
    p.budget_bytes = integer(v, "budget_bytes", where + ".", 0);
    p.kept_bytes = integer(v, "kept_bytes", where + ".", 0);
    p.backward_bytes = integer(v, "backward_bytes", where + ".", 0);
    p.forward_bytes = integer(v, "forward_bytes", where + ".", 0);
    p.off_bytes = integer(v, "off_bytes", where + ".", 0);
    p.recompute_micros = real(v, "recompute_micros", where + ".");
    if (const JsonValue* ops = v.find("ops")) p.ops = *ops;
    return p;
  }

  MeasuredStep measured(const JsonValue& v, const std::string& where) const {
    object(v, where);
    MeasuredStep r;
    r.step = integer(v, "step", where + ".", 0);
    r.measured_bytes = integer(v, "measured_bytes", where + ".", INT64_MIN);
    r.measured_event = text(v, "measured_event", where + ".");
    r.planned = flag(v, "planned", where + ".");
    if (r.planned) {
      r.predicted_bytes = integer(v, "predicted_bytes", where + ".", INT64_MIN);
      r.predicted_event = text(v, "predicted_event", where + ".");
      r.fragmentation_bytes = integer(v, "fragmentation_bytes", where + ".", 0);
    }
    return r;
  }

 private:
  std::string source_;
};

// Note [The step record's format]: a version 1 plan's names, as version 2 spells them.
void fromVersion1(JsonValue& doc) {
  JsonValue up = JsonValue::object();
  for (const auto& [key, value] : doc.members()) {
    const std::string name = key == "memory_target_bytes"  ? "target_bytes"
                             : key == "meta_measured_bytes" ? "measured_bytes"
                             : key == "meta_measured_event" ? "measured_event"
                                                            : key;
    up.set(name, value);
  }
  doc = std::move(up);
}

}  // namespace

double StepRecord::recomputeMicros() const {
  double sum = 0;
  for (const LayerPlan& p : layers) {
    if (p.checkpointed) sum += p.recompute_micros;
  }
  return sum;
}

const LayerPlan* StepRecord::layer(const std::string& path) const {
  for (const LayerPlan& p : layers) {
    if (p.path == path) return &p;
  }
  return nullptr;
}

std::string stepRecordJson(const StepRecord& r) {
  JsonValue v = JsonValue::object();
  v.set("format", JsonValue::string(kStepRecordFormat));
  v.set("target_bytes", JsonValue::number(r.target_bytes));
  v.set("predicted_bytes", JsonValue::number(r.predicted_bytes));
  v.set("predicted_event", JsonValue::string(r.predicted_event));
  v.set("planned_at_step", JsonValue::number(r.planned_at_step));
  v.set("margin_bytes", JsonValue::number(r.margin_bytes));
  v.set("error", JsonValue::string(r.error));
  v.set("measured_bytes", r.measured_bytes >= 0 ? JsonValue::number(r.measured_bytes) : JsonValue());
  v.set("measured_event", r.measured_bytes >= 0 ? JsonValue::string(r.measured_event) : JsonValue());
  v.set("recompute_micros", JsonValue::number(r.recomputeMicros()));
  JsonValue layers = JsonValue::array();
  for (const LayerPlan& p : r.layers) layers.push(layerJson(p));
  v.set("layers", std::move(layers));
  JsonValue events = JsonValue::object();
  for (const auto& [name, base] : r.events) events.set(name, JsonValue::number(base));
  v.set("events", std::move(events));
  JsonValue history = JsonValue::array();
  for (const MeasuredStep& m : r.history) history.push(historyJson(m, r.target_bytes));
  v.set("history", std::move(history));
  for (const auto& [key, value] : r.context) {
    if (key != "format" && ownKeys().count(key) == 0) v.set(key, value);
  }
  return v.dump();
}

StepRecord readStepRecord(const std::string& text, const std::string& source) {
  JsonValue doc = parseJson(text, "hpac: step record " + source);
  const Reader in(source);
  in.object(doc, "the document");
  const std::string format = in.text(doc, "format", "");
  if (format == "hpac-step-plan 1") {
    fromVersion1(doc);
  } else if (format != kStepRecordFormat) {
    in.fail("format", "is '" + format + "' (records are converted from hpac-step-plan 1 only: make this one again "
                      "with `python -m hpac plan`)");
  }
  StepRecord r;
  r.target_bytes = in.integer(doc, "target_bytes", "", 1);
  r.predicted_bytes = in.integer(doc, "predicted_bytes", "", 0);
  r.predicted_event = in.text(doc, "predicted_event", "");
  if (doc.find("planned_at_step")) r.planned_at_step = in.integer(doc, "planned_at_step", "", 0);
  if (doc.find("margin_bytes")) r.margin_bytes = in.integer(doc, "margin_bytes", "", 0);
  if (doc.find("error")) r.error = in.text(doc, "error", "");
  const JsonValue* measured = doc.find("measured_bytes");
  if (measured != nullptr && measured->kind() != JsonValue::Kind::kNull) {
    r.measured_bytes = in.integer(doc, "measured_bytes", "", 0);
    r.measured_event = in.text(doc, "measured_event", "");
  }
  const JsonValue& layers = in.list(doc, "layers", "");
  for (size_t i = 0; i < layers.items().size(); ++i) {
    r.layers.push_back(in.layer(layers.items()[i], "layers[" + std::to_string(i) + "]"));
    if (r.layer(r.layers.back().path) != &r.layers.back()) in.fail("layers[" + std::to_string(i) + "].path",
                                                                   "'" + r.layers.back().path + "' is given twice");
  }
  if (r.layers.empty()) in.fail("layers", "is empty");
  const JsonValue& events = in.get(doc, "events", "");
  in.object(events, "events");
  for (const auto& [name, base] : events.members()) r.events.emplace_back(name, in.integer(events, name, "events.",
                                                                                            INT64_MIN));
  if (doc.find("history") != nullptr) {
    const JsonValue& rows = in.list(doc, "history", "");
    for (size_t i = 0; i < rows.items().size(); ++i) {
      r.history.push_back(in.measured(rows.items()[i], "history[" + std::to_string(i) + "]"));
    }
  }
  for (const auto& [key, value] : doc.members()) {
    if (key != "format" && ownKeys().count(key) == 0) r.context.emplace_back(key, value);
  }
  return r;
}

}  // namespace hpac
