// hpac/replay/state_writes.h
//
// StateWrites: in-place writes a region makes to tensors it did not create
// (Note [State written twice]).
#pragma once

#include "policy/op_tables.h"
#include "replay/op_occurrence.h"
#include "replay/recompute_rules.h"

#include <ATen/core/Tensor.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>
#include <c10/core/StorageImpl.h>
#include <c10/util/intrusive_ptr.h>

#include <cstdint>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

namespace hpac {

// Note [State written twice]
// A region that writes in place into a tensor it did not create — a module
// buffer (a router's running expert load, `self._cumulative_expert_load +=
// counts`; BatchNorm's running statistics and num_batches_tracked), an input,
// a parameter — writes it in the forward, and again when backward re-runs the
// region: a counter is counted twice, running statistics move twice. hpac
// sees it happen. In the forward, the storage of every fresh tensor an op
// returns (not a view, not an in-place result) is noted; a mutable op that
// writes a storage nobody in the region produced is an outside write, and its
// (op, occurrence) is recorded with a description of the tensor (its module
// name, when the Python integration named the module's buffers and parameters,
// Invocation::nameState). When the recompute reaches that (op, occurrence),
// StateWriteRule (replay/recompute_rules.h) says what happens:
//  - warn (default): it runs again, with one warning per op and tensor for the
//    process;
//  - error: backward stops with an error naming the op and the tensor;
//  - skip: the write is made once, in the forward. A pure in-place or out= op
//    (every return is a written argument) is not run: its returns are its own
//    arguments, which hold the values the forward wrote, and the ops after it
//    read them as the forward's later ops did. An op with results of its own
//    (batch norm: outputs, and running statistics written on the side) runs
//    with each outside tensor it writes replaced by a scratch copy.
// Such an op is never saved, whatever the policy says: serving its snapshot
// would write the forward's value back over whatever wrote the tensor since
// (another layer's region adding to a shared counter). Batch norm kernels
// (aten::native_batch_norm and its cuDNN / MIOpen forms) write the running
// statistics in training without annotating them; they are counted as writes.
// Not covered: writes through aten::copy_, which the replay ignores (FSDP2's
// lifecycle), and ops that read the state before it is written — in the
// recompute they see the value after the forward's write, with or without skip.
class StateWrites {
 public:
  struct Write {
    std::vector<size_t> outside_args;  // argument indices that hold an outside tensor
    bool only_writes = false;          // every return aliases a written argument: skipping the op loses nothing
    std::string what;                  // "'gate.load' ([8] Float)", or "a [8] Float tensor" when unnamed
    std::string name;                  // "gate.load"; empty when unnamed (the key of its one warning)
  };
  // What the recompute does with an outside write the forward made (replay()).
  enum class Replay : uint8_t {
    kRun,       // made again (warn, after its one warning)
    kSkip,      // not made: skipWrite() in place of the kernel (an only_writes op)
    kRedirect,  // the kernel runs with its outside arguments redirected to scratch copies (redirectWrites())
  };

  // Names outside tensors for messages (module buffers and parameters).
  void name(const std::vector<at::Tensor>& tensors, const std::vector<std::string>& names);
  // Forward, after any op ran: notes the storages of its fresh returns.
  void noteProduced(const c10::FunctionSchema& schema, bool returns_alias, const torch::jit::Stack& stack);
  // Forward, before an op runs: records (op, occurrence) and returns true if it writes an outside tensor.
  bool checkWrite(const c10::OperatorHandle& op, int64_t occurrence, const torch::jit::Stack& stack);
  // Whether `op` may write an argument its schema does not annotate (batch norm's running statistics).
  static bool writesUnannotated(const c10::OperatorHandle& op);
  // Forward: whether an op of this forward returned `storage` fresh (false for inputs, parameters, buffers).
  bool produced(const c10::StorageImpl* storage) const { return produced_.count(storage) != 0; }
  // Forward end: the produced storages are forgotten (the records stay for the recompute).
  void endForward() { produced_.clear(); }
  const Write* find(const c10::OperatorHandle& op, int64_t occurrence) const {
    if (writes_.empty()) return nullptr;
    const auto it = writes_.find(Key{opId(op), occurrence});
    return it == writes_.end() ? nullptr : &it->second;
  }
  bool empty() const { return writes_.empty(); }

  // Recompute, at the (op, occurrence) of `w`: what `rule` makes of it. Throws for StateWriteRule::kError, warns
  // once per op and tensor for kWarn; `invocation` names it in the message.
  static Replay replay(const Write& w, const c10::OperatorHandle& op, int64_t occurrence, uint64_t invocation,
                       StateWriteRule rule);
  // Replay::kSkip: pops the arguments and pushes the ones its returns alias.
  static void skipWrite(const c10::OperatorHandle& op, torch::jit::Stack* stack);
  // Replay::kRedirect, before the kernel: the outside tensors it writes become scratch copies.
  void redirectWrites(const c10::OperatorHandle& op, int64_t occurrence, torch::jit::Stack* stack) const;

 private:
  using Key = OpOccurrence;
  using KeyHash = OpOccurrenceHash;
  // The name given to t's storage (name()), empty when none is alive.
  std::string nameOf(const at::Tensor& t) const;
  static std::string describe(const at::Tensor& t, const std::string& name);
  // Storages some op of this forward returned fresh. The region's outside tensors all existed before it began and
  // live through it, so no storage created inside can share an address with one: raw addresses suffice.
  std::unordered_set<const c10::StorageImpl*> produced_;
  std::unordered_map<Key, Write, KeyHash> writes_;
  std::unordered_map<const c10::StorageImpl*, std::pair<c10::weak_intrusive_ptr<c10::StorageImpl>, std::string>> names_;
};

}  // namespace hpac
