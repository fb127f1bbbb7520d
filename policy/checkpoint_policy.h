// hpac/policy/checkpoint_policy.h
//
// CheckpointPolicy and the policy interface.
//
// A policy decides, for one operator call inside a checkpoint region, whether
// its outputs are kept from the forward pass (SAVE) or computed again during the
// backward-time recompute (RECOMPUTE). The replay layer asks the policy once per
// op in the forward phase only; the recompute replays the decisions the forward
// recorded (Note [Decisions are recorded] in replay/invocation.cpp), so a
// policy's recompute-phase state can no longer make the phases disagree.
//
// This header has no dispatcher registration and no storage: policy/ only maps
// (phase, invocation, op, occurrence, arguments) to a CheckpointPolicy.
#pragma once

#include "policy/profiled_op.h"

#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/ivalue.h>
#include <c10/util/ArrayRef.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace hpac {

// CheckpointPolicy
//
// The four answers of PyTorch's selective checkpointing. MUST_* and PREFER_*
// behave the same in eager replay (the PREFER variants leave room for a compiler
// to override); they are kept distinct so that policies written for PyTorch
// translate one to one.
enum class CheckpointPolicy : uint8_t {
  MUST_SAVE,
  PREFER_SAVE,
  MUST_RECOMPUTE,
  PREFER_RECOMPUTE,
};

inline bool isSave(CheckpointPolicy p) {
  return p == CheckpointPolicy::MUST_SAVE || p == CheckpointPolicy::PREFER_SAVE;
}

const char* toString(CheckpointPolicy p);

// OpContext
//
// What a policy sees for one op call. `occurrence` counts calls of this exact
// operator (name and overload) within the invocation and phase, from 0.
// `arguments` are the op's boxed arguments, valid only during the call.
struct OpContext {
  bool is_recompute;
  uint64_t invocation;
  const c10::OperatorHandle& op;
  int64_t occurrence;
  c10::ArrayRef<c10::IValue> arguments;
};

// Policy
//
// One Policy object serves one invocation (one checkpoint call): it may keep
// counters, and it is used by one thread at a time. Policies are made by a
// PolicyFactory for every checkpoint call.
class Policy {
 public:
  virtual ~Policy() = default;
  virtual CheckpointPolicy decide(const OpContext& ctx) = 0;
  // Why the last decide() answered as it did — the table or rule of the
  // policy, or the plan entry — for explain (replay/explain.h). Asked only
  // while an invocation records decisions, right after decide(); "" when the
  // policy gives no reason.
  virtual std::string reason() const { return {}; }
  // Called when the invocation enters a phase (a second backward re-enters the
  // recompute phase); per-phase counters reset here. decide() is called in the
  // forward phase only.
  virtual void onPhaseBegin(bool is_recompute) {}
  // Called when the phase ends; `completed` is false when it ended by an exception.
  virtual void onPhaseEnd(bool is_recompute, bool completed) {}

  // Profiling (the budget policy, policy/budget_policy.h): while wantsProfile()
  // is true at the start of a forward, every counted op of that forward has its
  // kernel timed, and observe() receives what keeping its outputs would cost
  // (ProfiledOp: kernel time, and the storages keep() would hold — fresh ids
  // for snapshots of written arguments). ctx.arguments is empty there.
  virtual bool wantsProfile() const { return false; }
  virtual void observe(const OpContext& ctx, const ProfiledOp& profile) {}
  // While profiling: autograd saved for backward a tensor held by the storage
  // that observe() named `storage_id`, or by no op output's storage (-1: an
  // input, a parameter) (Note [What off keeps] in policy/budget_plan.h).
  // Called through the checkpoint's saved-tensor hook.
  virtual void observeAutogradSaved(int64_t storage_id) {}
  // While profiling, right after observeAutogradSaved() for the same tensor:
  // the frame around this forward holds what needs no recompute and stops its
  // recompute early (hpac's frames; torch.utils.checkpoint's does neither),
  // and `region_made` says whether the region made the tensor's storage (else
  // the frame holds it whatever the plan: an input, a parameter). Note [The
  // recompute's fixed cost] in policy/budget_plan.h. Called from
  // Invocation::holdSaved.
  virtual void observeFrameHolds(bool region_made) {}
  // Asked right after a forward decide() that answered recompute: whether the
  // recompute may skip this op's kernel because nothing backward needs
  // depends on it (Note [Dead ops are skipped], policy/budget_plan.h). The
  // invocation records the answer with the op's output shapes and skips only
  // ops whose schema allows it.
  virtual bool skipInRecompute() const { return false; }
  // Asked once when a forward begins: whether it may answer skipInRecompute()
  // true at all (only then is that asked per op, and the invocation watches
  // what autograd saves, Note [Skips are verified]).
  virtual bool maySkipInRecompute() const { return false; }
  // Asked by a checkpoint frame that can hold saved tensors itself (hpac's own)
  // for each tensor autograd saves in the forward: hold it whatever produced
  // it, as off does, because the policy may keep that much (a budget that
  // covers what off keeps; Note [Frames hold what needs no recompute],
  // replay/invocation.h).
  virtual bool holdsEverySaved() const { return false; }
  // Note [Decided after the op]
  // A policy whose answer comes after the op ran, from its caller (a Python
  // policy_fn, called as torch's SAC calls it: with the op's output). decide()
  // then answers provisionally: the invocation keeps every savable op's
  // outputs, and the caller settles the last one right after the op returns
  // (Invocation::settleLast): a recompute answer releases the entry again. An
  // op nobody settles before the next op is admitted (or the forward ends) is
  // recomputed. The recompute replays what was settled, as for every policy.
  virtual bool decidesAfterRun() const { return false; }
};

using PolicyFactory = std::function<std::unique_ptr<Policy>()>;

// The policy of Note [Decided after the op]: every op provisionally saved,
// settled by the caller after the op ran.
PolicyFactory decidedAfterRunPolicy();

// Recompute everything: a plain (full) activation checkpoint.
PolicyFactory recomputeAllPolicy();

// Bool adapter, like PyTorch's: true -> MUST_SAVE, false -> PREFER_RECOMPUTE.
// `fn` is copied into every policy the factory makes.
PolicyFactory boolPolicy(std::function<bool(const OpContext&)> fn);

// Save list, like PyTorch's `create_selective_checkpoint_contexts(list)`:
// listed ops MUST_SAVE, the rest PREFER_RECOMPUTE. Entries use the op-table
// syntax of op_tables.h ("aten::mm" = every overload, "aten::max.dim" = one).
// Throws c10::Error naming the entry when an entry is malformed or no such op
// is registered.
PolicyFactory saveListPolicy(const std::vector<std::string>& ops);

// Any callable as a policy (stateless, or stateful with its state copied per
// invocation). `label` names it in explain's rule column ("<label>: <answer>").
PolicyFactory functionPolicy(std::function<CheckpointPolicy(const OpContext&)> fn,
                             std::string label = "policy function");

}  // namespace hpac
