#include "policy/policy_kind.h"

#include "policy/selective_policy.h"

#include <c10/util/Exception.h>

#include <array>
#include <utility>

namespace hpac {
namespace {

constexpr std::array<std::pair<PolicyKind, const char*>, 5> kNames = {{
    {PolicyKind::kFull, "full"},
    {PolicyKind::kSelective, "selective"},
    {PolicyKind::kSaveList, "save_list"},
    {PolicyKind::kSaveAll, "save_all"},
    {PolicyKind::kPolicyFn, "policy_fn"},
}};

}  // namespace

const char* toString(PolicyKind kind) {
  for (const auto& [k, name] : kNames) {
    if (k == kind) return name;
  }
  return "?";
}

PolicyKind parsePolicyKind(const std::string& name, const char* caller) {
  for (const auto& [k, n] : kNames) {
    if (name == n) return k;
  }
  TORCH_CHECK(false, caller, ": unknown policy kind '", name, "'; allowed: full, selective, save_list, save_all, "
              "policy_fn");
}

PolicyFactory policyForKind(PolicyKind kind, const std::vector<std::string>& save_list, const char* caller) {
  TORCH_CHECK(kind == PolicyKind::kSaveList || save_list.empty(), caller, ": policy kind '", toString(kind),
              "' takes no save list (got ", save_list.size(), " entries); use kind 'save_list'");
  switch (kind) {
    case PolicyKind::kFull:
      return PolicyFactory{};
    case PolicyKind::kSelective:
      return selectivePolicy();
    case PolicyKind::kSaveList:
      return saveListPolicy(save_list);
    case PolicyKind::kSaveAll:
      return functionPolicy([](const OpContext&) { return CheckpointPolicy::MUST_SAVE; }, "save_all");
    case PolicyKind::kPolicyFn:
      return decidedAfterRunPolicy();
  }
  TORCH_CHECK(false, caller, ": policy kind ", static_cast<int>(kind), " is not one of hpac::PolicyKind");
}

}  // namespace hpac
