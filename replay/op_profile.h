// hpac/replay/op_profile.h
//
// OpProfile: the budget profile of one invocation's forward, owned by the
// Invocation. While a forward is a profile (Policy::wantsProfile()), the
// fallback times every op and the invocation hands it here; each counted op
// that ran becomes one ProfiledOp (policy/profiled_op.h) for the policy
// (Policy::observe): its kernel time, what keeping its outputs would hold
// (Note [Profile storage ids]), its dataflow (Note [Dead ops are skipped],
// policy/budget_plan.h), its work on the device's roofline (Note [Estimated op
// costs], replay/op_cost.h). A record reaches the policy one op late, so that
// the reads of ignored ops after it can be added (ProfiledOp::later_reads).
// The tensors autograd saves are reported by the profiled storage holding
// them (Policy::observeAutogradSaved, Note [What off keeps]).
//
// Outside a profile nothing here runs: active() is the invocation's one check.
// Thread safety: that of its Invocation (one thread at a time).
#pragma once

#include "policy/checkpoint_policy.h"
#include "policy/op_tables.h"
#include "policy/profiled_op.h"
#include "replay/op_cost.h"
#include "replay/storage_ids.h"

#include <ATen/core/Tensor.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

namespace hpac {

class OpProfile {
 public:
  // `invocation` names the invocation in what the policy is told (OpContext).
  OpProfile(const ResolvedOpTables& tables, uint64_t invocation) : tables_(tables), invocation_(invocation) {}

  // A phase begins: a profile when `active` (a forward whose policy wants one); forgets the last phase's.
  void begin(bool active);
  bool active() const { return active_; }
  // Before a timed op (forward, active): the storages it reads and its argument work.
  void noteArguments(const c10::OperatorHandle& op, const torch::jit::Stack& stack);
  // After a counted op that ran (its returns on `stack`), with its time: records it and hands the record before
  // it to `policy`.
  void record(Policy& policy, const c10::OperatorHandle& op, int64_t occurrence, const torch::jit::Stack& stack,
              int64_t nanos);
  // After an ignored op: when it reads values, what it read counts as read after the last record.
  void noteIgnored(const c10::OperatorHandle& op);
  // A tensor autograd saves: tells `policy` which profiled storage holds it.
  void noteAutogradSaved(Policy& policy, const at::Tensor& t);
  // The forward ended: the last record goes to `policy`; the storages are forgotten.
  void end(Policy& policy);

 private:
  void flush(Policy& policy);

  const ResolvedOpTables& tables_;
  const uint64_t invocation_;
  bool active_ = false;
  StorageIds ids_;                  // Note [Profile storage ids]
  std::vector<int64_t> pending_reads_;  // storage ids of the running op's tensor arguments
  OpWork pending_work_;                 // the running op's flops and argument bytes
  // Note [The recompute's fixed cost] (policy/budget_plan.h): when the last counted op (or the phase) ended, and
  // the host time from then to the running op's start.
  std::chrono::steady_clock::time_point last_end_;
  double pending_gap_micros_ = 0;
  int64_t live_start_ = -1;  // the tracker's live bytes when the profile began; -1: not measured
  std::unique_ptr<ProfiledOp> last_;    // handed to the policy when the next counted op arrives
  std::optional<c10::OperatorHandle> last_op_;
};

}  // namespace hpac
