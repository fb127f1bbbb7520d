#include "policy/policy_kind.h"

#include "policy/field_policies.h"
#include "policy/selective_policy.h"

#include <c10/util/Exception.h>

#include <array>
#include <utility>

namespace hpac {
namespace {

constexpr std::array<std::pair<PolicyKind, const char*>, 8> kNames = {{
    {PolicyKind::kFull, "full"},
    {PolicyKind::kSelective, "selective"},
    {PolicyKind::kSaveList, "save_list"},
    {PolicyKind::kSaveAll, "save_all"},
    {PolicyKind::kPolicyFn, "policy_fn"},
    {PolicyKind::kTorchtitan, "torchtitan"},
    {PolicyKind::kSaveAllBut, "save_all_but"},
    {PolicyKind::kSaveOccurrences, "save_occurrences"},
}};

}  // namespace

const char* toString(PolicyKind kind) {
  for (const auto& [k, name] : kNames) {
    if (k == kind) return name;
  }
  return "?";
}

std::string policyKindNames() {
  std::string out;
  for (const auto& [k, name] : kNames) {
    if (!out.empty()) out += ", ";
    out += name;
  }
  return out;
}

PolicyKind parsePolicyKind(const std::string& name, const char* caller) {
  for (const auto& [k, n] : kNames) {
    if (name == n) return k;
  }
  TORCH_CHECK(false, caller, ": unknown policy kind '", name, "'; allowed: ", policyKindNames());
}

bool takesParameters(PolicyKind kind) {
  return kind == PolicyKind::kSaveList || kind == PolicyKind::kSaveAllBut || kind == PolicyKind::kSaveOccurrences ||
         kind == PolicyKind::kTorchtitan;
}

PolicyFactory policyForKind(PolicyKind kind, const std::vector<std::string>& params, const char* caller) {
  TORCH_CHECK(takesParameters(kind) || params.empty(), caller, ": policy kind '", toString(kind),
              "' takes no parameters (got ", params.size(), "); kinds with parameters: save_list and save_all_but "
              "(op names), save_occurrences (patterns), torchtitan (force-recompute shapes)");
  switch (kind) {
    case PolicyKind::kFull:
      return PolicyFactory{};
    case PolicyKind::kSelective:
      return selectivePolicy();
    case PolicyKind::kSaveList:
      return saveListPolicy(params);
    case PolicyKind::kSaveAll:
      return functionPolicy([](const OpContext&) { return CheckpointPolicy::MUST_SAVE; }, "save_all");
    case PolicyKind::kPolicyFn:
      return decidedAfterRunPolicy();
    case PolicyKind::kTorchtitan: {
      std::vector<MatmulShape> shapes;
      for (const auto& p : params) shapes.push_back(parseMatmulShape(p, caller));
      return torchtitanPolicy(std::move(shapes));
    }
    case PolicyKind::kSaveAllBut:
      return saveAllButPolicy(params);
    case PolicyKind::kSaveOccurrences:
      return occurrencePolicy(params);
  }
  TORCH_CHECK(false, caller, ": policy kind ", static_cast<int>(kind), " is not one of hpac::PolicyKind");
}

}  // namespace hpac
