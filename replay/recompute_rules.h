// hpac/replay/recompute_rules.h
//
// What a recompute does about the two things that can make it differ from the
// forward beyond the op sequence — shared by the C++ checkpoint, the Python
// API and the trainer's YAML (activation_checkpoint.routing / .state_writes):
//
//   RoutingRule (Note [Routing is verified], replay/routing_check.h)
//     verify  routing ops (topk, histc, sort, nonzero...) the policy recomputes
//             are recomputed, and their integer outputs must equal the
//             forward's; a difference stops backward with an error naming the
//             op and the occurrence (default)
//     save    routing ops are saved whatever the policy says, so the recompute
//             routes exactly as the forward did (torchtitan's and NeMo's choice)
//
//   StateWriteRule (Note [State written twice], replay/state_writes.h)
//     warn    an in-place write the recompute makes to a tensor from outside the
//             region (a module buffer, a counter, running statistics) runs
//             again, with one warning per op and tensor (default)
//     error   it stops backward with an error naming the op and the tensor
//     skip    it is not made again: a pure in-place / out= write is skipped, an
//             op with results of its own writes into a scratch copy instead
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace hpac {

enum class RoutingRule : uint8_t { kVerify, kSave };
enum class StateWriteRule : uint8_t { kWarn, kError, kSkip };

const char* toString(RoutingRule rule);
const char* toString(StateWriteRule rule);
const std::vector<std::string>& routingRuleNames();     // "verify", "save"
const std::vector<std::string>& stateWriteRuleNames();  // "warn", "error", "skip"

// false when `name` is not one of the names above.
bool parseRoutingRule(const std::string& name, RoutingRule* rule);
bool parseStateWriteRule(const std::string& name, StateWriteRule* rule);

// Throw c10::Error "<what>: '<name>' is not allowed; allowed: ...".
RoutingRule routingRuleOrThrow(const std::string& name, const std::string& what);
StateWriteRule stateWriteRuleOrThrow(const std::string& name, const std::string& what);

}  // namespace hpac
