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
#pragma once

#include "policy/checkpoint_policy.h"

#include <string>
#include <vector>

namespace hpac {

enum class PolicyKind { kFull, kSelective, kSaveList, kSaveAll, kPolicyFn };

const char* toString(PolicyKind kind);

// Parses a kind name. Throws c10::Error that starts with `caller`, names the
// value and lists the allowed names.
PolicyKind parsePolicyKind(const std::string& name, const char* caller);

// The policy of a kind. Only kSaveList takes a save list; any other kind with a
// non-empty one throws c10::Error (starting with `caller`).
PolicyFactory policyForKind(PolicyKind kind, const std::vector<std::string>& save_list, const char* caller);

}  // namespace hpac
