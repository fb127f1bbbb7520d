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
  explicit FunctionPolicy(std::function<CheckpointPolicy(const OpContext&)> fn) : fn_(std::move(fn)) {}
  CheckpointPolicy decide(const OpContext& ctx) override { return fn_(ctx); }

 private:
  std::function<CheckpointPolicy(const OpContext&)> fn_;
};

}  // namespace

PolicyFactory functionPolicy(std::function<CheckpointPolicy(const OpContext&)> fn) {
  TORCH_CHECK(fn, "hpac: functionPolicy needs a callable, got an empty std::function");
  return [fn = std::move(fn)]() -> std::unique_ptr<Policy> { return std::make_unique<FunctionPolicy>(fn); };
}

PolicyFactory recomputeAllPolicy() {
  return functionPolicy([](const OpContext&) { return CheckpointPolicy::PREFER_RECOMPUTE; });
}

PolicyFactory boolPolicy(std::function<bool(const OpContext&)> fn) {
  TORCH_CHECK(fn, "hpac: boolPolicy needs a callable, got an empty std::function");
  return functionPolicy([fn = std::move(fn)](const OpContext& ctx) {
    return fn(ctx) ? CheckpointPolicy::MUST_SAVE : CheckpointPolicy::PREFER_RECOMPUTE;
  });
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
  });
}

}  // namespace hpac
