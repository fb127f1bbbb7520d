#include "replay/recompute_rules.h"

#include <c10/util/Exception.h>
#include <c10/util/StringUtil.h>

namespace hpac {
namespace {

template <typename Rule>
bool parseName(const std::vector<std::string>& names, const std::string& name, Rule* rule) {
  for (size_t i = 0; i < names.size(); ++i) {
    if (names[i] == name) {
      *rule = static_cast<Rule>(i);
      return true;
    }
  }
  return false;
}

template <typename Rule>
Rule parseOrThrow(const std::vector<std::string>& names, const std::string& name, const std::string& what) {
  Rule rule{};
  TORCH_CHECK(parseName(names, name, &rule), what, ": '", name, "' is not allowed; allowed: ",
              c10::Join(", ", names));
  return rule;
}

const char* nameOf(const std::vector<std::string>& names, size_t i) {
  return i < names.size() ? names[i].c_str() : "?";
}

}  // namespace

const std::vector<std::string>& routingRuleNames() {
  static const std::vector<std::string> names = {"verify", "save"};
  return names;
}
const std::vector<std::string>& stateWriteRuleNames() {
  static const std::vector<std::string> names = {"warn", "error", "skip"};
  return names;
}

const char* toString(RoutingRule rule) { return nameOf(routingRuleNames(), static_cast<size_t>(rule)); }
const char* toString(StateWriteRule rule) { return nameOf(stateWriteRuleNames(), static_cast<size_t>(rule)); }

bool parseRoutingRule(const std::string& name, RoutingRule* rule) { return parseName(routingRuleNames(), name, rule); }
bool parseStateWriteRule(const std::string& name, StateWriteRule* rule) {
  return parseName(stateWriteRuleNames(), name, rule);
}

RoutingRule routingRuleOrThrow(const std::string& name, const std::string& what) {
  return parseOrThrow<RoutingRule>(routingRuleNames(), name, what);
}
StateWriteRule stateWriteRuleOrThrow(const std::string& name, const std::string& what) {
  return parseOrThrow<StateWriteRule>(stateWriteRuleNames(), name, what);
}

}  // namespace hpac
