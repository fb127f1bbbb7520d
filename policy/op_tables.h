// hpac/policy/op_tables.h
//
// Op tables as data, and their resolution against the running dispatcher.
//
// Every table is one sorted list of entries. An entry names either every
// overload of an operator ("aten::mm") or exactly one overload
// ("aten::empty.memory_format"; "aten::copy_.default" is the overload with the
// empty name). Entries marked optional are skipped when the running process has
// no such operator (SDPA kernels on torch 1.13, fsdp::* without FSDP2, ...);
// a required entry that does not resolve is an error.
#pragma once

#include <ATen/core/dispatch/Dispatcher.h>

#include <cstdint>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

namespace hpac {

// OpCategory: what the built-in tables say about one operator.
enum class OpCategory : uint8_t {
  kOther = 0,      // not in any table: recompute
  kIgnored,        // not counted, never cached (detach, profiler, FSDP lifecycle)
  kRecompute,      // always recomputed (topk)
  kMatmul,         // alternating save/recompute family
  kSave,           // compute-intensive, attention, max, collectives
};

const char* toString(OpCategory c);

struct OpEntry {
  const char* name;
  bool optional;
};

// The built-in tables (sorted by name; a test checks the order).
c10::ArrayRef<OpEntry> ignoredOps();
c10::ArrayRef<OpEntry> recomputeOps();
c10::ArrayRef<OpEntry> matmulOps();
c10::ArrayRef<OpEntry> saveOps();
c10::ArrayRef<OpEntry> unsafeAliasOps();
c10::ArrayRef<OpEntry> routingOps();
// torchtitan 0.3.0's SelectiveAC save set and its matmul pair (policy/field_policies.h); not part of
// ResolvedOpTables: the torchtitan policy resolves them itself.
c10::ArrayRef<OpEntry> torchtitanSaveOps();
c10::ArrayRef<OpEntry> torchtitanMatmulOps();

// Identity of an operator inside this process: the address of its registered
// name, stable for as long as the operator is registered.
using OpId = const void*;
inline OpId opId(const c10::OperatorHandle& op) {
  return &op.operator_name();
}
// The registered name an OpId is the address of.
inline const c10::OperatorName& operatorNameOf(OpId id) {
  return *static_cast<const c10::OperatorName*>(id);
}
// "ns::op" or "ns::op.overload": how op logs, explain rows, profiles and plans name an op.
inline std::string qualifiedOpName(const c10::OperatorName& name) {
  return name.overload_name.empty() ? name.name : name.name + "." + name.overload_name;
}
// How error messages and warnings name an op: qualifiedOpName, and "ns::op (default overload)" for an op without
// an overload name, so that a bare "aten::mm" is not read as every overload of it.
inline std::string messageOpName(const c10::OperatorName& name) {
  return name.overload_name.empty() ? name.name + " (default overload)" : qualifiedOpName(name);
}

// Resolves one entry against the dispatcher: every matching handle (empty when
// the op is absent). Throws c10::Error if `name` is not "ns::op[.overload]".
std::vector<c10::OperatorHandle> resolveEntry(const std::string& name);

// ResolvedOpTables
//
// The built-in tables resolved to OpIds. Immutable after construction, hence
// safe to read from any thread. `missingOptional()` lists the optional entries
// this process lacks; a required entry that is missing throws from the
// constructor.
class ResolvedOpTables {
 public:
  ResolvedOpTables();

  // The process-wide tables for the ops registered now. See Note [Ops
  // registered later]: when an operator that an optional entry names is
  // registered after the last resolution (FSDP2's fsdp::* ops appear when
  // Python imports torch.distributed.fsdp), the next call resolves the tables
  // again. Every instance handed out stays alive for the whole process, so
  // references kept by invocations and policies never dangle.
  static const ResolvedOpTables& global();
  // How many times global() has resolved the tables in this process.
  static int64_t resolutions();

  OpCategory classify(const c10::OperatorHandle& op) const {
    auto it = category_.find(opId(op));
    return it == category_.end() ? OpCategory::kOther : it->second;
  }
  bool isIgnored(const c10::OperatorHandle& op) const {
    return classify(op) == OpCategory::kIgnored;
  }
  // Ops whose outputs share storage with an input but not its version counter
  // (aten::_unsafe_view, aten::unsafe_split...): in-place writes through them
  // are invisible to the input's version counter (see Note [Unsafe aliases]).
  bool isUnsafeAlias(const c10::OperatorHandle& op) const { return unsafe_alias_.count(opId(op)) != 0; }
  // Whether the op's result aliases an input without writing it: a view (`Tensor(a) self -> Tensor(a)`) or an
  // unsafe alias. Such an op is never saved, whatever a policy answers (Note [Views are recomputed] in
  // replay/invocation.cpp), in eager replay and under a compiler alike (policy/traced_policy.h).
  bool returnsAlias(const c10::OperatorHandle& op) const {
    if (isUnsafeAlias(op)) return true;
    for (const auto& ret : op.schema().returns()) {
      if (ret.alias_info() != nullptr && !ret.alias_info()->isWrite()) return true;
    }
    return false;
  }
  // Routing ops (topk, histc, sort, nonzero...): their outputs decide where MoE tokens go, and a recompute that
  // computes them differently would route differently (Note [Routing is verified], replay/routing_check.h).
  bool isRouting(const c10::OperatorHandle& op) const { return routing_.count(opId(op)) != 0; }
  // The profiler's record_function enter and exit ops (ignored): hpac reads FSDP2's range names from them (Note
  // [FSDP ranges are ignored], replay/invocation.cpp).
  bool isRecordFunction(const c10::OperatorHandle& op) const { return record_function_.count(opId(op)) != 0; }
  const std::vector<std::string>& missingOptional() const { return missing_optional_; }
  size_t resolvedCount() const { return category_.size(); }

 private:
  void add(c10::ArrayRef<OpEntry> table, OpCategory category);
  void addSet(c10::ArrayRef<OpEntry> table, const char* label, std::unordered_set<OpId>& into);

  std::unordered_map<OpId, OpCategory> category_;
  std::unordered_set<OpId> unsafe_alias_;
  std::unordered_set<OpId> routing_;
  std::unordered_set<OpId> record_function_;
  std::vector<std::string> missing_optional_;
};

}  // namespace hpac
