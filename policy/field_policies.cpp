#include "policy/field_policies.h"

#include "policy/op_tables.h"

#include <c10/util/Exception.h>

#include <algorithm>
#include <cctype>
#include <limits>
#include <memory>
#include <optional>
#include <unordered_map>
#include <unordered_set>

namespace hpac {
namespace {

// The OpIds of a table's entries that this process has registered; a required entry that is missing throws.
std::unordered_set<OpId> resolveTable(c10::ArrayRef<OpEntry> table, const char* label) {
  std::unordered_set<OpId> ids;
  for (const OpEntry& entry : table) {
    const auto handles = resolveEntry(entry.name);
    TORCH_CHECK(!handles.empty() || entry.optional, "hpac: required op table entry '", entry.name, "' (", label,
                " table) is not registered in this process; this torch is not supported by hpac's ", label,
                " policy");
    for (const auto& h : handles) ids.insert(opId(h));
  }
  return ids;
}

// The OpIds one user-given entry names; throws naming the entry (and `what` it came from) when it names none.
std::vector<OpId> resolveUserEntry(const std::string& entry, const std::string& what) {
  std::vector<c10::OperatorHandle> handles;
  try {
    handles = resolveEntry(entry);
  } catch (const c10::Error& e) {
    TORCH_CHECK(false, "hpac: ", what, ": ", e.msg());
  }
  TORCH_CHECK(!handles.empty(), "hpac: ", what, ": '", entry,
              "' names no operator registered in this process; check the spelling ('aten::mm' for every overload, "
              "'aten::max.dim' for one)");
  std::vector<OpId> ids;
  for (const auto& h : handles) ids.push_back(opId(h));
  return ids;
}

struct TorchtitanTables {
  std::unordered_set<OpId> save;
  OpId mm = nullptr;
  OpId linear = nullptr;
  OpId to_copy = nullptr;
  std::optional<size_t> to_copy_device;  // index of _to_copy's `device` argument
  std::vector<MatmulShape> shapes;
};

class TorchtitanPolicy final : public Policy {
 public:
  explicit TorchtitanPolicy(std::shared_ptr<const TorchtitanTables> t) : t_(std::move(t)) {}

  CheckpointPolicy decide(const OpContext& ctx) override {
    const OpId id = opId(ctx.op);
    if (id == t_->to_copy && copiesCudaToCpu(ctx)) return answer(1, CheckpointPolicy::MUST_SAVE);
    int64_t& count = mm_count_[ctx.is_recompute ? 1 : 0];
    const bool is_mm = id == t_->mm || id == t_->linear;
    if (is_mm) {
      if (hasForcedShape(ctx, id == t_->linear)) return answer(2, CheckpointPolicy::PREFER_RECOMPUTE);
      ++count;  // torchtitan counts before it asks: its 1st matmul is count 1, saved
      last_count_ = count;
      return answer(3, count % 2 == 0 ? CheckpointPolicy::PREFER_RECOMPUTE : CheckpointPolicy::MUST_SAVE);
    }
    if (t_->save.count(id) != 0) return answer(4, CheckpointPolicy::MUST_SAVE);
    return answer(5, CheckpointPolicy::PREFER_RECOMPUTE);
  }

  std::string reason() const override {
    switch (last_rule_) {
      case 1: return "torchtitan rule 1: CUDA -> CPU copy, save";
      case 2: return "torchtitan rule 2: matmul of a force-recompute shape, recompute (not counted)";
      case 3:
        return "torchtitan rule 3: matmul " + std::to_string(last_count_) +
               (last_count_ % 2 == 0 ? " (even: recompute)" : " (odd: save)");
      case 4: return "torchtitan rule 4: save set";
      default: return "torchtitan rule 5: not in the save set, recompute";
    }
  }

  void onPhaseBegin(bool is_recompute) override { mm_count_[is_recompute ? 1 : 0] = 0; }

 private:
  CheckpointPolicy answer(int rule, CheckpointPolicy p) {
    last_rule_ = rule;
    return p;
  }

  bool copiesCudaToCpu(const OpContext& ctx) const {
    if (!t_->to_copy_device || ctx.arguments.size() <= *t_->to_copy_device) return false;
    const c10::IValue& self = ctx.arguments[0];
    const c10::IValue& device = ctx.arguments[*t_->to_copy_device];
    return self.isTensor() && self.toTensor().is_cuda() && device.isDevice() && device.toDevice().is_cpu() &&
           !device.toDevice().has_index();  // torchtitan: str(kwargs["device"]) == "cpu"
  }

  bool hasForcedShape(const OpContext& ctx, bool is_linear) const {
    if (t_->shapes.empty() || ctx.arguments.size() < 2 || !ctx.arguments[1].isTensor()) return false;
    const auto sizes = ctx.arguments[1].toTensor().sizes();
    if (sizes.size() != 2) return false;
    // mm's right-hand side is (in, out); linear's weight is (out, in).
    const MatmulShape shape = is_linear ? MatmulShape{sizes[1], sizes[0]} : MatmulShape{sizes[0], sizes[1]};
    return std::find(t_->shapes.begin(), t_->shapes.end(), shape) != t_->shapes.end();
  }

  std::shared_ptr<const TorchtitanTables> t_;
  int64_t mm_count_[2] = {0, 0};
  int last_rule_ = 5;
  int64_t last_count_ = 0;
};

OpId onlyOverload(const char* name, const char* overload) {
  const auto h = c10::Dispatcher::singleton().findSchema({name, overload});
  TORCH_CHECK(h.has_value(), "hpac: torchtitan policy: ", name, " is not registered in this process");
  return opId(*h);
}

}  // namespace

PolicyFactory torchtitanPolicy(std::vector<MatmulShape> force_recompute_shapes) {
  auto t = std::make_shared<TorchtitanTables>();
  t->save = resolveTable(torchtitanSaveOps(), "torchtitan");
  t->mm = onlyOverload("aten::mm", "");
  t->linear = onlyOverload("aten::linear", "");
  const auto to_copy = c10::Dispatcher::singleton().findSchema({"aten::_to_copy", ""});
  if (to_copy) {
    t->to_copy = opId(*to_copy);
    if (const auto index = to_copy->schema().argumentIndexWithName("device")) {
      t->to_copy_device = static_cast<size_t>(*index);
    }
  }
  t->shapes = std::move(force_recompute_shapes);
  std::shared_ptr<const TorchtitanTables> tables = std::move(t);
  return [tables]() -> std::unique_ptr<Policy> { return std::make_unique<TorchtitanPolicy>(tables); };
}

MatmulShape parseMatmulShape(const std::string& text, const char* caller) {
  const char* allowed = "allowed: 'INxOUT', two positive integers (an mm right-hand side or a Linear's "
                        "(in_features, out_features), e.g. '128x8')";
  const auto x = text.find('x');
  auto number = [&](const std::string& part) -> int64_t {
    TORCH_CHECK(!part.empty() && part.size() <= 12 &&
                    std::all_of(part.begin(), part.end(), [](unsigned char c) { return std::isdigit(c) != 0; }),
                caller, ": shape '", text, "' is not allowed; ", allowed);
    const int64_t v = std::stoll(part);
    TORCH_CHECK(v > 0, caller, ": shape '", text, "' is not allowed; ", allowed);
    return v;
  };
  TORCH_CHECK(x != std::string::npos, caller, ": shape '", text, "' is not allowed; ", allowed);
  return {number(text.substr(0, x)), number(text.substr(x + 1))};
}

PolicyFactory saveAllButPolicy(const std::vector<std::string>& ops) {
  auto recomputed = std::make_shared<std::unordered_set<OpId>>();
  for (const auto& entry : ops) {
    for (OpId id : resolveUserEntry(entry, "save_all_but entry")) recomputed->insert(id);
  }
  return functionPolicy([recomputed](const OpContext& ctx) {
    return recomputed->count(opId(ctx.op)) ? CheckpointPolicy::PREFER_RECOMPUTE : CheckpointPolicy::MUST_SAVE;
  }, "save_all_but (listed: recompute, else save)");
}

namespace {

// One ITEM of Note [Occurrence patterns]: start <= n < stop, (n - start) % step == 0.
struct OccurrenceSlice {
  int64_t start = 0;
  int64_t stop = std::numeric_limits<int64_t>::max();
  int64_t step = 1;
  bool contains(int64_t n) const { return n >= start && n < stop && (n - start) % step == 0; }
};

constexpr const char* kPatternAllowed =
    "allowed: 'ns::op[.overload]@ITEMS', ITEMS comma-separated occurrences counted from 0: N, A:B or A:B:S "
    "(Python's slice rules, parts may be left out), e.g. 'aten::mm@0,2', 'aten::bmm@1:3', 'aten::mm@::2'";

OccurrenceSlice parseSlice(const std::string& item, const std::string& pattern) {
  auto fail = [&]() {
    TORCH_CHECK(false, "hpac: occurrence pattern '", pattern, "': '", item, "' is not allowed; ", kPatternAllowed);
  };
  std::vector<std::string> parts(1);
  for (char c : item) {
    if (c == ':') {
      parts.emplace_back();
    } else {
      parts.back() += c;
    }
  }
  if (parts.size() > 3) fail();
  std::vector<std::optional<int64_t>> values;
  for (const auto& part : parts) {
    if (part.empty()) {
      values.emplace_back();
      continue;
    }
    if (part.size() > 12 ||
        !std::all_of(part.begin(), part.end(), [](unsigned char c) { return std::isdigit(c) != 0; })) {
      fail();
    }
    values.emplace_back(std::stoll(part));
  }
  OccurrenceSlice s;
  if (parts.size() == 1) {
    if (!values[0]) fail();
    s.start = *values[0];
    s.stop = s.start + 1;
    return s;
  }
  if (values[0]) s.start = *values[0];
  if (values[1]) s.stop = *values[1];
  if (parts.size() == 3 && values[2]) s.step = *values[2];
  if (s.step == 0) fail();
  return s;
}

}  // namespace

PolicyFactory occurrencePolicy(const std::vector<std::string>& patterns) {
  auto saved = std::make_shared<std::unordered_map<OpId, std::vector<OccurrenceSlice>>>();
  for (const auto& pattern : patterns) {
    const auto at = pattern.find('@');
    TORCH_CHECK(at != std::string::npos && at > 0 && at + 1 < pattern.size(), "hpac: occurrence pattern '", pattern,
                "' is not allowed; ", kPatternAllowed);
    const std::string op = pattern.substr(0, at);
    std::vector<OccurrenceSlice> slices;
    size_t begin = at + 1;
    while (true) {
      const auto comma = pattern.find(',', begin);
      slices.push_back(parseSlice(pattern.substr(begin, comma - begin), pattern));
      if (comma == std::string::npos) break;
      begin = comma + 1;
    }
    for (OpId id : resolveUserEntry(op, "occurrence pattern '" + pattern + "'")) {
      auto& into = (*saved)[id];
      into.insert(into.end(), slices.begin(), slices.end());
    }
  }
  return functionPolicy([saved](const OpContext& ctx) {
    const auto it = saved->find(opId(ctx.op));
    if (it == saved->end()) return CheckpointPolicy::PREFER_RECOMPUTE;
    const bool listed = std::any_of(it->second.begin(), it->second.end(),
                                    [&](const OccurrenceSlice& s) { return s.contains(ctx.occurrence); });
    return listed ? CheckpointPolicy::MUST_SAVE : CheckpointPolicy::PREFER_RECOMPUTE;
  }, "save_occurrences (listed occurrences: save, else recompute)");
}

}  // namespace hpac
