// hpac/replay/invocation.h
//
// Invocation: the state of one checkpoint call, shared by its forward and its
// recompute. Ops reach it through the fallback (plugin/fallback.cpp) while a
// RegionGuard for it is alive: the fallback admits each op (admit(): count it,
// ask the policy), runs it below hpac's key unless it is served, and hands the
// results back for fix-up. In the forward phase every op runs, and the outputs
// of ops the policy saves are kept as detached aliases under (op, occurrence).
// In the recompute phase saved ops are served from that storage without
// running their kernel, each entry released as it is served; all other ops run
// again. Invocation itself never runs a kernel.
//
// Invocation's own job is admission: counting each op per phase, asking the
// policy in the forward, replaying its answer in the recompute. Everything
// else lives in a unit of its own, a member of the Invocation, which forwards
// to it: the saved outputs and their serving (ReplayStorage,
// replay/replay_storage.h), the ops the recompute skips (DeadOps,
// replay/dead_ops.h), writes to outside state (StateWrites,
// replay/state_writes.h), the routing check (RoutingCheck,
// replay/routing_check.h), the outer saved-tensor hooks (OuterHooks,
// replay/outer_hooks.h), the budget profile (OpProfile, replay/op_profile.h),
// and explain's rows (DecisionRecorder, replay/explain.h, attached when
// explain asks). The public methods below are grouped by that unit.
//
// Thread safety: one thread at a time (the forward thread, later the thread
// that runs backward). Stats are plain reads after the fact.
#pragma once

#include "policy/checkpoint_policy.h"
#include "policy/op_tables.h"
#include "replay/dead_ops.h"
#include "replay/op_profile.h"
#include "replay/outer_hooks.h"
#include "replay/phase.h"
#include "replay/recompute_rules.h"
#include "replay/replay_storage.h"
#include "replay/routing_check.h"
#include "replay/state_writes.h"

#include <ATen/core/Tensor.h>
#include <ATen/core/dispatch/Dispatcher.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

namespace hpac {

class DecisionRecorder;  // replay/explain.h

// InvocationStats: the evidence that backward re-ran the region.
struct InvocationStats {
  int64_t ops_forward = 0;    // ops counted in the forward phase
  int64_t ops_recompute = 0;  // ops counted in the recompute phase(s)
  int64_t saved = 0;          // op outputs kept by the forward
  int64_t saved_bytes = 0;    // bytes of tensors kept (storage nbytes of each output)
  int64_t served = 0;         // ops served from storage in recompute (kernel skipped)
  int64_t recomputed = 0;     // ops whose kernel ran again in recompute
  int64_t skipped = 0;        // recompute ops not run: nothing backward needs depends on them (Note [Dead ops are skipped])
  int64_t ignored = 0;        // ignored ops (both phases), never counted
  int64_t recomputes = 0;     // recompute phases entered
  int64_t unserved = 0;       // saved entries no recompute asked for, released when it ended
  int64_t unserved_bytes = 0; // their bytes
  int64_t routing_checked = 0; // routing op outputs the recompute compared with the forward's (Note [Routing is verified])
  int64_t routing_kept_bytes = 0;  // bytes of the forward's routing decisions kept for that comparison
  int64_t state_writes = 0;   // recompute writes to tensors from outside the region met (Note [State written twice])
  int64_t state_writes_skipped = 0;  // of which not made again (StateWriteRule::kSkip)
  int64_t packed = 0;         // kept tensors handed to the outer saved-tensor hooks (Note [Outer saved-tensor hooks])
  int64_t held = 0;           // tensors autograd saved that the checkpoint frame held itself (Note [Frames hold what needs no recompute])

  InvocationStats& operator+=(const InvocationStats& o);
};

// Process-wide totals over every invocation that has finished a phase.
InvocationStats globalStats();
void resetGlobalStats();

struct InvocationOptions {
  // Allow user code to mutate a cached output in place after it was saved:
  // saved outputs are then cloned (costs memory) instead of aliased.
  bool allow_cache_mutation = false;
  // Explain (replay/explain.h): when set, every op of this invocation is
  // recorded there, with its kernel timed. Null: nothing is recorded.
  std::shared_ptr<DecisionRecorder> recorder;
  // What the recompute does about routing ops and outside state (replay/recompute_rules.h).
  RoutingRule routing = RoutingRule::kVerify;
  StateWriteRule state_writes = StateWriteRule::kWarn;
  // Hand what the region keeps to the saved-tensor hooks around it (Note [Outer saved-tensor hooks]).
  bool respect_saved_tensors_hooks = true;
};

class Invocation {
 public:
  // --- The call and its phases -------------------------------------------------------------------------------------
  // `policy` may be empty: recompute everything.
  explicit Invocation(const PolicyFactory& policy, InvocationOptions options = {});
  ~Invocation();
  Invocation(const Invocation&) = delete;
  Invocation& operator=(const Invocation&) = delete;

  uint64_t id() const { return id_; }
  // Invocations alive in the process now (a lifetime check: with no autograd graph alive, 0).
  static int64_t alive();
  const InvocationStats& stats() const { return stats_; }
  const InvocationOptions& options() const { return options_; }
  // Called by RegionGuard: resets the op counters of `phase` / adds this
  // phase's stats to the global totals. A recompute phase that ends releases
  // the saved entries it never asked for (Note [Decisions are recorded]);
  // `completed` is false when it ended by an exception (torch's early stop
  // of a recompute, an error), and only a completed one warns about them.
  void beginPhase(Phase phase);
  void endPhase(bool completed);

  // --- Admission: what the fallback does with one op ---------------------------------------------------------------
  enum class Action : uint8_t {
    kIgnore,     // not counted, not cached: run it (ignored-op table)
    kRun,        // forward, not saved: run it, then afterRun()
    kSave,       // forward, saved: take the arguments it writes, run it, then keep()
    kServe,      // recompute, saved: serve() — the kernel does not run
    kRecompute,  // recompute, not saved: run it again
    kSkip,       // recompute, dead: uninitialised returns of the forward's shapes (Note [Dead ops are skipped])
    kSkipWrite,  // recompute, an outside write made once already: returns its arguments (Note [State written twice])
  };
  struct Admission {
    Action action;
    int64_t occurrence;     // of this op in this phase (-1 for kIgnore)
    ReplayStorage::Entry* entry = nullptr;  // kServe: the saved entry admit() found, so serve() looks it up once
    const DeadOps::Returns* skipped = nullptr;  // kSkip: the forward's return shapes
    bool remember_skip = false;  // kRun: the policy marked it dead for the recompute; afterRun() records its shapes
    bool check_routing = false;  // kRun: a routing op; afterRun() keeps its decision (Note [Routing is verified])
    bool verify_routing = false;  // kRecompute: verifyRouting() after the kernel
    bool redirect_writes = false;  // kRecompute: redirectWrites() before the kernel (Note [State written twice])
  };
  // Counts the op in `phase` and says what to do: in the forward the policy
  // decides, in the recompute the forward's decision is replayed
  // (Note [Decisions are recorded]). In the forward, an op about to write into
  // a cached output first gives the cache its private copy (Note [Copy on write]).
  Admission admit(Phase phase, const c10::OperatorHandle& op, const torch::jit::Stack& stack);
  // Does what admit() said: `run_kernel()` runs the op below hpac's key (the
  // fallback's redispatch, Note [Redispatch below hpac]); kServe, kSkip and
  // kSkipWrite never call it, hpac pushes their returns. Inlined into the
  // fallback: no allocation or virtual call per op.
  template <class RunKernel>
  void perform(const Admission& admission, const c10::OperatorHandle& op, torch::jit::Stack* stack,
               RunKernel&& run_kernel) {
    switch (admission.action) {
      case Action::kServe:
        serve(admission, op, stack);  // the kernel does not run
        return;
      case Action::kSave: {
        PendingSave pending = ReplayStorage::beginSave(admission.occurrence, op, *stack);
        run_kernel();
        keep(std::move(pending), op, stack);
        return;
      }
      case Action::kRun:
        run_kernel();
        afterRun(admission, op, *stack);
        return;
      case Action::kSkip:
        dead_ops_.skip(*admission.skipped, op, stack);  // the kernel does not run (Note [Dead ops are skipped])
        return;
      case Action::kSkipWrite:
        StateWrites::skipWrite(op, stack);  // made once, in the forward (Note [State written twice])
        return;
      case Action::kRecompute:
        if (C10_UNLIKELY(admission.redirect_writes)) state_writes_.redirectWrites(op, admission.occurrence, stack);
        run_kernel();
        if (C10_UNLIKELY(admission.verify_routing)) verifyRouting(admission, op, *stack);  // Note [Routing is verified]
        return;
      case Action::kIgnore:
        run_kernel();
        return;
    }
  }
  // Recompute phase: whether the next call of `op` runs its kernel (false:
  // served from storage, or skipped). Asked by hpac's Python package before an
  // outer dispatch mode would see the op (Note [Outer dispatch modes see what
  // ran], plugin/python/hpac/_policy_fn.py).
  bool runsInRecompute(const c10::OperatorHandle& op) const;
  // Note [Decided after the op] (policy/checkpoint_policy.h): the caller's
  // answer for the op this forward kept last, provisionally. Returns false,
  // changing nothing, when that op is not `op` (an op hpac ignores, a view,
  // which is never saved, or an op already settled). A recompute answer
  // releases the entry; a save answer keeps it (as a clone when cache mutation
  // is allowed).
  bool settleLast(const c10::OperatorHandle& op, CheckpointPolicy answer);

  // --- Saved outputs (ReplayStorage, replay/replay_storage.h) ------------------------------------------------------
  // Entries still held (saved and not yet served).
  size_t storedEntries() const { return storage_.entries(); }
  int64_t storedBytes() const { return storage_.bytes(); }

  // --- Frames: what autograd saves (Note [Frames hold what needs no recompute]) ------------------------------------
  // A tensor autograd saves for backward while this forward runs (the
  // checkpoint's saved-tensor hook calls it). While profiling, tells the policy
  // which profiled storage holds it (Note [What off keeps], policy/budget_plan.h);
  // otherwise nothing.
  void noteAutogradSaved(const at::Tensor& t);
  // Whether noteAutogradSaved() wants to hear of this forward's saved tensors:
  // a budget profile, or a forward that may skip ops (Note [Skips are verified]).
  bool watchesAutogradSaves() const {
    return phase_ == Phase::kForward && (profile_.active() || may_skip_);
  }
  // Note [Frames hold what needs no recompute]
  // A checkpoint frame replaces each tensor autograd saves by a placeholder
  // and re-runs the region when backward unpacks one. Some saved tensors need
  // no recompute to exist in backward: the region keeps their storage anyway (a
  // saved op's output, or a view of one), or the region did not produce them
  // (an input, a parameter, a buffer), so the frame holds them at no memory
  // cost; and when the policy may keep as much as off does (a budget that
  // covers off's bytes: Policy::holdsEverySaved), every saved tensor is held,
  // costing what off costs for it. holdSaved() says which: a detached alias (sharing the version
  // counter) of `t` when the frame may hold it, undefined when only the
  // recompute can produce it. Never with allow_cache_mutation (the region keeps
  // clones, not `t`), outer saved-tensor hooks (what is kept must go through
  // them: Note [Outer saved-tensor hooks]), or a Python tensor subclass (its
  // storage is not where its values are: Note [Saved wrapper subclasses]).
  // hpac's frames (hpac.checkpoint, hpac::checkpoint) hold what it gives, and
  // unpack a held tensor whose version is unchanged without a recompute; when
  // the forward held every saved tensor, nothing is left to compute: the frame
  // calls releaseKept() and backward never re-runs the region (budget 1.0, a
  // save-everything policy). torch.utils.checkpoint's frame packs for itself;
  // there its early stop ends the recompute once it has what backward needs.
  at::Tensor holdSaved(const at::Tensor& t);
  // After a forward whose frame held everything autograd saved: the kept entries are released now (the frame's
  // aliases keep what backward reads); a recompute of this invocation is then an error.
  void releaseKept();
  bool keptReleased() const { return kept_released_; }

  // --- Outside-state writes (StateWrites, replay/state_writes.h; Note [State written twice]) -----------------------
  // Forward, after any op ran (ignored ones too): notes the storages it returned fresh.
  void noteProduced(const Admission& admission, const c10::OperatorHandle& op, const torch::jit::Stack& stack) {
    if (admission.action == Action::kSkip || admission.action == Action::kServe) return;
    state_writes_.noteProduced(op.schema(), tables_.returnsAlias(op), stack);
  }
  // Names for outside tensors in messages (module buffers and parameters).
  void nameState(const std::vector<at::Tensor>& tensors, const std::vector<std::string>& names) {
    state_writes_.name(tensors, names);
  }

  // --- Outer saved-tensor hooks (OuterHooks, replay/outer_hooks.h) -------------------------------------------------
  // The hooks around the region, captured by whoever enters the forward (Note [Outer saved-tensor hooks]);
  // ignored unless options.respect_saved_tensors_hooks.
  void useOuterHooks(std::shared_ptr<const OuterHooks> hooks) {
    if (respect_outer_hooks_) outer_hooks_ = std::move(hooks);
  }
  // The caller's own answer, given before a forward, overriding options.respect_saved_tensors_hooks from then on
  // (torch >= 2.14's checkpoint(respect_saved_tensors_hooks=True|False); Note [torch's respect_saved_tensors_hooks]
  // in plugin/python/hpac/_regions.py).
  void respectSavedTensorsHooks(bool respect) { respect_outer_hooks_ = respect; }

  // --- Timing: the budget profile (OpProfile, replay/op_profile.h) and explain (DecisionRecorder) ------------------
  // Whether the fallback times ops and reports them through observe(): while
  // this forward is a profile (Policy::wantsProfile(); kRun ops), or while a
  // recorder is attached (every op, both phases). The fallback's only cost
  // without either is this one branch.
  bool timing() const { return profile_.active() || recorder_ != nullptr; }
  bool profiling() const { return profile_.active(); }
  // Before the op, when timing(): the storages of its arguments (explain's byte accounting).
  void observeArguments(const c10::OperatorHandle& op, const torch::jit::Stack& stack);
  // After the op (after keep() / serve() for kSave / kServe), with its time.
  void observe(const Admission& admission, const c10::OperatorHandle& op, const torch::jit::Stack& stack,
               int64_t nanos);
  // Explain: attach a recorder (replay/explain.h) before the forward, like InvocationOptions::recorder.
  void recordDecisions(std::shared_ptr<DecisionRecorder> recorder) { recorder_ = std::move(recorder); }
  const std::shared_ptr<DecisionRecorder>& recorder() const { return recorder_; }

  // --- Op log ------------------------------------------------------------------------------------------------------
  // Off by default (tests and explain tools): while on, every op the
  // fallback hands to this invocation is appended as "phase ns::op.overload
  // action", action one of ignored, run (forward, recompute policy), saved,
  // served, recomputed.
  void recordOps(bool on) { record_ops_ = on; }
  const std::vector<std::string>& opLog() const { return op_log_; }

 private:
  // Admission (invocation.cpp).
  Admission admitIgnored(Phase phase, const c10::OperatorHandle& op, const torch::jit::Stack& stack);
  Admission admitForward(const c10::OperatorHandle& op, const torch::jit::Stack& stack);
  Admission admitRecompute(const c10::OperatorHandle& op);
  void trackRecordFunction(const c10::OperatorHandle& op, const torch::jit::Stack& stack);
  void discard(const OpOccurrence& key);
  // What perform() does around the kernel (invocation.cpp).
  using PendingSave = ReplayStorage::PendingSave;
  // kRun, after the kernel: watches outputs that alias a cached output without
  // sharing its version counter (Note [Unsafe aliases]); keeps a routing op's
  // decision; records the return shapes of an op the recompute will skip.
  void afterRun(const Admission& admission, const c10::OperatorHandle& op, const torch::jit::Stack& stack);
  // kSave, after the kernel: keeps the returns (and snapshots of the written
  // arguments) under (op, occurrence).
  void keep(PendingSave pending, const c10::OperatorHandle& op, torch::jit::Stack* stack);
  // kServe: pops the arguments and pushes what the forward kept; releases the entry.
  void serve(const Admission& admission, const c10::OperatorHandle& op, torch::jit::Stack* stack);
  // kRecompute with verify_routing, after the kernel: throws if it routed otherwise than the forward
  // (RoutingCheck, replay/routing_check.h).
  void verifyRouting(const Admission& admission, const c10::OperatorHandle& op, const torch::jit::Stack& stack);
  // Outside-state writes.
  Admission recomputeStateWrite(Admission admission, const c10::OperatorHandle& op, const StateWrites::Write& write);
  // Explain and the op log.
  void recordOp(const Admission& admission, const c10::OperatorHandle& op, const torch::jit::Stack& stack,
                int64_t nanos);
  void logOp(Phase phase, const c10::OperatorHandle& op, const char* action);

  // The call and its phases.
  const uint64_t id_;
  const InvocationOptions options_;
  const ResolvedOpTables& tables_;
  std::unique_ptr<Policy> policy_;
  Phase phase_ = Phase::kForward;
  InvocationStats stats_;
  InvocationStats reported_;  // part of stats_ already added to the global totals
  // Admission.
  std::unordered_map<OpId, int64_t> occurrences_[2];
  CheckpointPolicy last_answer_ = CheckpointPolicy::PREFER_RECOMPUTE;  // of the last decide()
  // Note [Decided after the op]: whether the policy's answers are provisional, and the entry kept last, unsettled.
  const bool decides_after_run_;
  std::optional<OpOccurrence> unsettled_;
  int fsdp_depth_ = 0;  // Note [FSDP ranges are ignored]
  // Saved outputs.
  ReplayStorage storage_;
  // Frames.
  bool kept_released_ = false;  // Note [Frames hold what needs no recompute]
  // Dead ops (Note [Dead ops are skipped]).
  DeadOps dead_ops_;
  bool may_skip_ = false;  // this forward's policy may mark ops to skip (Policy::maySkipInRecompute)
  // Outside-state writes.
  StateWrites state_writes_;
  // Routing.
  RoutingCheck routing_;
  // Outer saved-tensor hooks.
  std::shared_ptr<const OuterHooks> outer_hooks_;
  bool respect_outer_hooks_;  // options_.respect_saved_tensors_hooks unless respectSavedTensorsHooks() said otherwise
  // Timing.
  OpProfile profile_;  // the budget profile (replay/op_profile.h)
  std::shared_ptr<DecisionRecorder> recorder_;
  // Op log.
  bool record_ops_ = false;
  std::vector<std::string> op_log_;
};

}  // namespace hpac
