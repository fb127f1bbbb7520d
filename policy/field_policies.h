// hpac/policy/field_policies.h
//
// Policies from the field, as data: rules that other projects ship as Python
// policy functions for torch's selective checkpointing, written here in C++ so
// that no Python runs per op. Each is selectable by a kind name
// (policy_kind.h: torchtitan, save_all_but, save_occurrences), from Python
// (hpac.PolicySpec) and from the trainer's YAML (activation_checkpoint.policy).
//
//   torchtitanPolicy(shapes)      torchtitan 0.3.0's SelectiveAC
//   saveAllButPolicy(ops)         every op saved except the listed ones
//   occurrencePolicy(patterns)    the listed (op, occurrence) pairs saved, the rest recomputed
//
// Factories resolve their op names when made and throw c10::Error naming the
// bad entry; the policies they make are as cheap per op as the selective one.
#pragma once

#include "policy/checkpoint_policy.h"

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace hpac {

// An mm right-hand side shape (in_features, out_features): torchtitan's
// force_recompute_mm_shapes_by_fqns resolved to the (in, out) of each matching
// nn.Linear.
using MatmulShape = std::pair<int64_t, int64_t>;

// Note [torchtitan's SelectiveAC]
// torchtitan 0.3.0 (torchtitan/distributed/activation_checkpoint.py,
// SelectiveAC._wrap_block), in its order, per op of the forward:
//   1. aten::_to_copy.default from a CUDA tensor to device cpu -> MUST_SAVE
//   2. aten::mm.default / aten::linear.default whose weight (args[1]; linear's
//      transposed to (in, out)) has a force-recompute shape -> PREFER_RECOMPUTE,
//      not counted
//   3. the same two ops otherwise: a counter per phase; the 2nd, 4th... call
//      PREFER_RECOMPUTE, the 1st, 3rd... MUST_SAVE
//   4. the save set (op_tables.cpp, kTorchtitanSaveOps) -> MUST_SAVE
//   5. everything else -> PREFER_RECOMPUTE
// Rules 1 and 2 read the op's arguments; where a caller has none (a traced
// policy under torch.compile) they do not apply.
PolicyFactory torchtitanPolicy(std::vector<MatmulShape> force_recompute_shapes = {});

// Parses "INxOUT" (two positive integers, e.g. "128x8"). Throws c10::Error that
// starts with `caller` and says what is allowed.
MatmulShape parseMatmulShape(const std::string& text, const char* caller);

// Every op MUST_SAVE except the listed ones (op-table syntax, op_tables.h),
// which are PREFER_RECOMPUTE: the complement of saveListPolicy. Views are never
// saved whatever a policy answers (Note [Views are recomputed]).
PolicyFactory saveAllButPolicy(const std::vector<std::string>& ops);

// Note [Occurrence patterns]
// One pattern is `OP@ITEMS`: OP in op-table syntax ("aten::mm" = every
// overload, "aten::mm.default" = one) and ITEMS a comma-separated list of
// occurrences of that op in the invocation's forward, counted from 0 per
// overload (OpContext::occurrence, as explain and op logs number them):
//   N        that occurrence                         aten::mm@0,2
//   A:B      A <= occurrence < B                     aten::bmm@1:3
//   A:B:S    from A below B every S-th (Python's slice rules; each part may be
//            left out: start 0, no stop, step 1)     aten::mm@::2  aten::mm@1::2
// The listed occurrences are MUST_SAVE, every other op PREFER_RECOMPUTE;
// several patterns (of one op or several) add up.
PolicyFactory occurrencePolicy(const std::vector<std::string>& patterns);

}  // namespace hpac
