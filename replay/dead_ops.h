// hpac/replay/dead_ops.h
//
// DeadOps: the ops of one invocation that its recompute skips (Note [Dead ops
// are skipped], policy/budget_plan.h), owned by the Invocation.
//   forward    remember() records the return shapes of each op the plan
//              marks dead; checkReads(), noteIgnored() and
//              noteAutogradSaved() watch whether anything the recompute runs
//              or autograd saves reads one of their outputs, which voids
//              every skip of the invocation when the forward ends
//              (Note [Skips are verified]).
//   recompute  find() gives a skipped (op, occurrence) its forward's return
//              shapes; skip() pushes uninitialised returns of those shapes
//              over one scratch buffer per device (Note [Skipped outputs
//              share one buffer]) in place of running the kernel.
// Everything the fallback's hot path asks (empty(), watching(), find()) is
// inline; nothing here allocates for an op that is neither marked nor skipped.
//
// Thread safety: that of its Invocation (one thread at a time).
#pragma once

#include "policy/op_tables.h"
#include "replay/op_occurrence.h"
#include "replay/storage_ids.h"

#include <ATen/core/Tensor.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>

#include <cstddef>
#include <cstdint>
#include <unordered_map>
#include <utility>
#include <vector>

namespace hpac {

// Whether an ignored op reads its arguments' values: not views (aten::view,
// detach) nor empty_like, which read only sizes (Note [Dead ops are skipped]).
bool readsValues(const ResolvedOpTables& tables, const c10::OperatorHandle& op);

class DeadOps {
 public:
  // What a skipped op hands back: its forward's returns, shape and options.
  struct Returns {
    std::vector<std::pair<std::vector<int64_t>, std::vector<int64_t>>> shapes;  // (sizes, strides) per return
    std::vector<at::TensorOptions> options;
  };

  explicit DeadOps(const ResolvedOpTables& tables) : tables_(tables) {}

  // Whether an op's kernel may be skipped in a recompute at all: aten, not
  // mutable, not seeded random, every return a defined dense floating-point
  // or complex tensor with storage (`stack` holds its returns).
  static bool skippable(const c10::OperatorHandle& op, const torch::jit::Stack& stack);

  // Forward, after an op the policy marked dead ran: records its return
  // shapes when it is skippable(), and watches its outputs' storages.
  void remember(const c10::OperatorHandle& op, int64_t occurrence, const torch::jit::Stack& stack);
  // Whether this forward marked any output (the fallback's one check before the two below).
  bool watching() const { return !storages_.empty(); }
  // Forward, before an op the recompute will run: voids the skips if one of
  // its `num_args` arguments lives in a marked output (Note [Skips are verified]).
  void checkReads(const torch::jit::Stack& stack, size_t num_args);
  // Forward, before an ignored op: checkReads() if it reads values.
  void noteIgnored(const c10::OperatorHandle& op, const torch::jit::Stack& stack) {
    if (readsValues(tables_, op)) checkReads(stack, op.schema().arguments().size());
  }
  // Forward: a tensor autograd saves; voids the skips if it lives in a marked output.
  void noteAutogradSaved(const at::Tensor& t) {
    if (!storages_.empty() && storages_.find(t) >= 0) void_ = true;
  }
  // The forward ended: its skips stand only if it completed and nothing voided them.
  void endForward(bool completed);
  // A recompute ended: its scratch buffers go (the skipped returns still alive keep theirs).
  void endRecompute() { scratch_.clear(); }

  // Recompute: whether any op is skipped, and the forward's returns of one that is (else null).
  bool empty() const { return skipped_.empty(); }
  const Returns* find(OpId op, int64_t occurrence) const {
    const auto it = skipped_.find(Key{op, occurrence});
    return it == skipped_.end() ? nullptr : &it->second;
  }
  // Pops the op's arguments and pushes uninitialised tensors shaped like `returns`.
  void skip(const Returns& returns, const c10::OperatorHandle& op, torch::jit::Stack* stack);

 private:
  using Key = OpOccurrence;
  using KeyHash = OpOccurrenceHash;
  const ResolvedOpTables& tables_;
  std::unordered_map<Key, Returns, KeyHash> skipped_;
  // Note [Skips are verified]: storages of this forward's skip-marked outputs
  // (held weakly, so their addresses stay theirs), and whether something the
  // recompute runs or autograd saves read one.
  StorageIds storages_;
  bool void_ = false;
  std::vector<std::pair<c10::Device, at::Tensor>> scratch_;  // Note [Skipped outputs share one buffer]
};

}  // namespace hpac
