// hpac/replay/op_occurrence.h
//
// OpOccurrence: an op's place in one phase of an invocation, (op, its
// occurrence among that op's calls in the phase). The key of everything an
// invocation keeps per op: saved outputs, the forward's return shapes of
// skipped ops, routing decisions, writes to outside tensors.
#pragma once

#include "policy/op_tables.h"  // OpId

#include <cstdint>
#include <functional>

namespace hpac {

struct OpOccurrence {
  OpId op;
  int64_t occurrence;
  bool operator==(const OpOccurrence& o) const { return op == o.op && occurrence == o.occurrence; }
};

struct OpOccurrenceHash {
  size_t operator()(const OpOccurrence& k) const {
    return std::hash<const void*>()(k.op) * 31 + static_cast<size_t>(k.occurrence);
  }
};

}  // namespace hpac
