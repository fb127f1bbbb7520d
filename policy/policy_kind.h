// hpac/policy/policy_kind.h
//
// The policies a caller can name with a word — from Python
// (torch.classes.hpac.Invocation), the C API and the command-line tools — and
// the one place those words are parsed:
//   full       recompute everything (no policy)
//   selective  the built-in rules (policy/selective_policy.h)
//   save_list  save exactly the listed ops (saveListPolicy)
//   save_all   save every counted op (a test and benchmark baseline)
//   policy_fn  decided per op by the caller after the op ran (a Python
//              policy_fn; Note [Decided after the op], checkpoint_policy.h)
//   torchtitan        torchtitan 0.3.0's SelectiveAC (field_policies.h)
//   save_all_but      save every op except the listed ones
//   save_occurrences  save the listed (op, occurrence) pairs (Note [Occurrence patterns])
// A kind's parameters are a list of strings: op names (save_list, save_all_but),
// patterns (save_occurrences), force-recompute shapes "INxOUT" (torchtitan).
#pragma once

#include "policy/checkpoint_policy.h"

#include <string>
#include <vector>

namespace hpac {

enum class PolicyKind { kFull, kSelective, kSaveList, kSaveAll, kPolicyFn, kTorchtitan, kSaveAllBut, kSaveOccurrences };

const char* toString(PolicyKind kind);

// Parses a kind name. Throws c10::Error that starts with `caller`, names the
// value and lists the allowed names.
PolicyKind parsePolicyKind(const std::string& name, const char* caller);

// Every kind name, in declaration order, joined by ", " (for messages that list what is allowed).
std::string policyKindNames();

// Whether a kind takes parameters (save_list, save_all_but, save_occurrences, torchtitan).
bool takesParameters(PolicyKind kind);

// The policy of a kind with its parameters (see above). A kind that takes none
// given some, or a malformed parameter, throws c10::Error starting with `caller`.
PolicyFactory policyForKind(PolicyKind kind, const std::vector<std::string>& params, const char* caller);

}  // namespace hpac
