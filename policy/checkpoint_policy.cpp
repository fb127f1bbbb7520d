#include "policy/checkpoint_policy.h"

#include "policy/op_tables.h"

#include <c10/util/Exception.h>

#include <unordered_set>

namespace hpac {

const char* toString(CheckpointPolicy p) {
  switch (p) {
    case CheckpointPolicy::MUST_SAVE: return "MUST_SAVE";
    case CheckpointPolicy::PREFER_SAVE: return "PREFER_SAVE";
    case CheckpointPolicy::MUST_RECOMPUTE: return "MUST_RECOMPUTE";
    case CheckpointPolicy::PREFER_RECOMPUTE: return "PREFER_RECOMPUTE";
  }
  return "?";
}

namespace {

class FunctionPolicy final : public Policy {
 public:
  FunctionPolicy(std::function<CheckpointPolicy(const OpContext&)> fn, std::shared_ptr<const std::string> label)
      : fn_(std::move(fn)), label_(std::move(label)) {}
  CheckpointPolicy decide(const OpContext& ctx) override { return last_ = fn_(ctx); }
  std::string reason() const override { return *label_ + ": " + toString(last_); }

 private:
  std::function<CheckpointPolicy(const OpContext&)> fn_;
  std::shared_ptr<const std::string> label_;
  CheckpointPolicy last_ = CheckpointPolicy::PREFER_RECOMPUTE;
};

}  // namespace

PolicyFactory functionPolicy(std::function<CheckpointPolicy(const OpContext&)> fn, std::string label) {
  TORCH_CHECK(fn, "hpac: functionPolicy needs a callable, got an empty std::function");
  auto name = std::make_shared<const std::string>(std::move(label));
  return [fn = std::move(fn), name]() -> std::unique_ptr<Policy> {
    return std::make_unique<FunctionPolicy>(fn, name);
  };
}

PolicyFactory recomputeAllPolicy() {
  return functionPolicy([](const OpContext&) { return CheckpointPolicy::PREFER_RECOMPUTE; },
                        "full (recompute every op)");
}

PolicyFactory boolPolicy(std::function<bool(const OpContext&)> fn) {
  TORCH_CHECK(fn, "hpac: boolPolicy needs a callable, got an empty std::function");
  return functionPolicy([fn = std::move(fn)](const OpContext& ctx) {
    return fn(ctx) ? CheckpointPolicy::MUST_SAVE : CheckpointPolicy::PREFER_RECOMPUTE;
  }, "bool policy function");
}

PolicyFactory saveListPolicy(const std::vector<std::string>& ops) {
  auto saved = std::make_shared<std::unordered_set<OpId>>();
  for (const auto& entry : ops) {
    const auto handles = resolveEntry(entry);
    TORCH_CHECK(!handles.empty(), "hpac: save list entry '", entry,
                "' names no operator registered in this process; check the spelling "
                "('aten::mm' for every overload, 'aten::max.dim' for one)");
    for (const auto& h : handles) saved->insert(opId(h));
  }
  return functionPolicy([saved](const OpContext& ctx) {
    return saved->count(opId(ctx.op)) ? CheckpointPolicy::MUST_SAVE : CheckpointPolicy::PREFER_RECOMPUTE;
  }, "save list (listed: save, else recompute)");
}

namespace {

class DecidedAfterRunPolicy final : public Policy {
 public:
  CheckpointPolicy decide(const OpContext&) override { return CheckpointPolicy::MUST_SAVE; }
  std::string reason() const override { return "policy_fn (settled after the op)"; }
  bool decidesAfterRun() const override { return true; }
};

}  // namespace

PolicyFactory decidedAfterRunPolicy() {
  return [] { return std::make_unique<DecidedAfterRunPolicy>(); };
}

}  // namespace hpac
