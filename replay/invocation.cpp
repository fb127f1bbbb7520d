#include "replay/invocation.h"

#include "replay/explain.h"

#include <c10/macros/Macros.h>
#include <c10/util/Exception.h>

#include <exception>
#include <mutex>

namespace hpac {
namespace {

std::atomic<uint64_t> next_invocation_id{1};
std::atomic<int64_t> invocations_alive{0};

std::mutex& globalMutex() {
  static std::mutex m;
  return m;
}
InvocationStats& globalTotals() {
  static InvocationStats s;
  return s;
}

// The replay mismatch: the recompute met (op, occurrence) where the forward stored nothing.
[[noreturn]] void throwNotInStorage(const c10::OperatorHandle& op, int64_t occurrence, uint64_t invocation,
                                    int64_t forward_count) {
  TORCH_CHECK(false, "hpac: ", messageOpName(op.operator_name()), " occurrence ", occurrence, " of invocation ", invocation,
              " is not in storage: the forward ran this op ", forward_count,
              " times, and the recompute met an occurrence the forward never ran. "
              "The checkpointed region ran a different op sequence in backward than in forward "
              "(data-dependent control flow, or state that changed between forward and backward). "
              "Make the region deterministic, or keep the varying part outside the checkpoint.");
}

}  // namespace

// The one list of InvocationStats fields: a += k * b.
static void addScaled(InvocationStats& a, const InvocationStats& b, int64_t k) {
  a.ops_forward += k * b.ops_forward;
  a.ops_recompute += k * b.ops_recompute;
  a.saved += k * b.saved;
  a.saved_bytes += k * b.saved_bytes;
  a.served += k * b.served;
  a.recomputed += k * b.recomputed;
  a.skipped += k * b.skipped;
  a.ignored += k * b.ignored;
  a.recomputes += k * b.recomputes;
  a.unserved += k * b.unserved;
  a.unserved_bytes += k * b.unserved_bytes;
  a.routing_checked += k * b.routing_checked;
  a.routing_kept_bytes += k * b.routing_kept_bytes;
  a.state_writes += k * b.state_writes;
  a.state_writes_skipped += k * b.state_writes_skipped;
  a.packed += k * b.packed;
  a.held += k * b.held;
}

InvocationStats& InvocationStats::operator+=(const InvocationStats& o) {
  addScaled(*this, o, 1);
  return *this;
}

InvocationStats globalStats() {
  std::lock_guard<std::mutex> lock(globalMutex());
  return globalTotals();
}

void resetGlobalStats() {
  std::lock_guard<std::mutex> lock(globalMutex());
  globalTotals() = InvocationStats{};
}

Invocation::Invocation(const PolicyFactory& policy, InvocationOptions options)
    : id_(next_invocation_id.fetch_add(1)),
      options_(options),
      tables_(ResolvedOpTables::global()),
      policy_(policy ? policy() : recomputeAllPolicy()()),
      decides_after_run_(policy_ != nullptr && policy_->decidesAfterRun()),
      storage_(id_, options_.allow_cache_mutation, options_.allow_cache_mutation && !decides_after_run_),
      dead_ops_(tables_),
      respect_outer_hooks_(options_.respect_saved_tensors_hooks),
      profile_(tables_, id_),
      recorder_(options_.recorder) {
  TORCH_CHECK(policy_ != nullptr, "hpac: the policy factory of invocation ", id_, " returned a null policy");
  invocations_alive.fetch_add(1, std::memory_order_relaxed);  // after the last throw: the destructor will run
}

Invocation::~Invocation() {
  invocations_alive.fetch_sub(1, std::memory_order_relaxed);
}

int64_t Invocation::alive() {
  return invocations_alive.load(std::memory_order_relaxed);
}

void Invocation::beginPhase(Phase phase) {
  TORCH_CHECK(phase != Phase::kRecompute || !kept_released_, "hpac: invocation ", id_, " cannot recompute: its "
              "frame held every tensor autograd saved, so its kept outputs were released after the forward (Note "
              "[Frames hold what needs no recompute])");
  phase_ = phase;
  profile_.begin(phase == Phase::kForward && policy_->wantsProfile());
  may_skip_ = phase == Phase::kForward && policy_->maySkipInRecompute();
  occurrences_[static_cast<int>(phase)].clear();
  fsdp_depth_ = 0;  // Note [FSDP ranges are ignored]
  if (phase == Phase::kRecompute) ++stats_.recomputes;
  policy_->onPhaseBegin(phase == Phase::kRecompute);
}

void Invocation::endPhase(bool completed) {
  std::exception_ptr failed;
  if (phase_ == Phase::kRecompute) {
    const ReplayStorage::Unserved unserved = storage_.releaseUnserved(completed);  // Note [Decisions are recorded]
    stats_.unserved += unserved.count;
    stats_.unserved_bytes += unserved.bytes;
    dead_ops_.endRecompute();
    routing_.clear();  // decisions a recompute ended early never compared
  }
  if (profile_.active()) profile_.end(*policy_);
  if (phase_ == Phase::kForward) {  // Note [Skips are verified]
    if (unsettled_) discard(*unsettled_);  // Note [Decided after the op]: nobody answered for the last op
    dead_ops_.endForward(completed);
    state_writes_.endForward();
    if (outer_hooks_ != nullptr && completed) {
      try {
        stats_.packed += storage_.packKept(*outer_hooks_);  // Note [Outer saved-tensor hooks]
      } catch (...) {  // Note [Ending a region can fail]: the user's pack raised; the forward did not complete
        failed = std::current_exception();
        completed = false;
      }
    }
    outer_hooks_.reset();
  }
  policy_->onPhaseEnd(phase_ == Phase::kRecompute, completed);
  InvocationStats delta = stats_;
  addScaled(delta, reported_, -1);
  reported_ = stats_;
  {
    std::lock_guard<std::mutex> lock(globalMutex());
    globalTotals() += delta;
  }
  if (failed) std::rethrow_exception(failed);
}

Invocation::Admission Invocation::admit(Phase phase, const c10::OperatorHandle& op,
                                        const torch::jit::Stack& stack) {
  // Note [Decided after the op]: an op kept provisionally that nobody settled before this one is recomputed.
  if (C10_UNLIKELY(unsettled_.has_value()) && phase == Phase::kForward && !tables_.isIgnored(op)) {
    discard(*unsettled_);
  }
  if (phase == Phase::kForward && storage_.watchesStorages() && op.schema().is_mutable()) {
    storage_.copyOnWrite(op.schema(), stack);  // Note [Copy on write]
  }
  if (tables_.isIgnored(op) || C10_UNLIKELY(fsdp_depth_ > 0)) return admitIgnored(phase, op, stack);
  if (phase == Phase::kRecompute) return admitRecompute(op);
  return admitForward(op, stack);
}

// An op of the ignored-op table, or any op inside an FSDP range: run, never counted.
Invocation::Admission Invocation::admitIgnored(Phase phase, const c10::OperatorHandle& op,
                                               const torch::jit::Stack& stack) {
  if (C10_UNLIKELY(tables_.isRecordFunction(op))) trackRecordFunction(op, stack);
  if (C10_UNLIKELY(dead_ops_.watching()) && phase == Phase::kForward) dead_ops_.noteIgnored(op, stack);
  ++stats_.ignored;
  if (C10_UNLIKELY(record_ops_)) logOp(phase, op, "ignored");
  return Admission{Action::kIgnore, -1};
}

// The forward: the policy decides.
Invocation::Admission Invocation::admitForward(const c10::OperatorHandle& op, const torch::jit::Stack& stack) {
  const int64_t occurrence = occurrences_[0][opId(op)]++;
  // Note [State written twice]
  const bool writes_outside = (op.schema().is_mutable() || StateWrites::writesUnannotated(op)) &&
                              state_writes_.checkWrite(op, occurrence, stack);
  const size_t num_args = op.schema().arguments().size();
  const OpContext ctx{/*recompute=*/false, id_, op, occurrence,
                      c10::ArrayRef<c10::IValue>(stack.data() + stack.size() - num_args, num_args)};
  last_answer_ = policy_->decide(ctx);
  // Note [Views are recomputed]
  bool save_op = isSave(last_answer_) && !tables_.returnsAlias(op) && !writes_outside;
  // Note [Routing is verified]: routing ops are saved (RoutingRule::kSave) or their decision kept for the check.
  const bool routing = tables_.isRouting(op) && !tables_.returnsAlias(op);
  if (routing && options_.routing == RoutingRule::kSave) save_op = true;
  if (C10_UNLIKELY(record_ops_)) logOp(Phase::kForward, op, save_op ? "saved" : "run");
  ++stats_.ops_forward;
  Admission admission{save_op ? Action::kSave : Action::kRun, occurrence};
  admission.remember_skip = may_skip_ && !save_op && !isSave(last_answer_) && policy_->skipInRecompute();
  admission.check_routing = routing && !save_op && !admission.remember_skip;
  if (C10_UNLIKELY(dead_ops_.watching()) && !save_op && !admission.remember_skip && !tables_.returnsAlias(op)) {
    dead_ops_.checkReads(stack, num_args);  // an op the recompute runs
  }
  return admission;
}

// Note [Decisions are recorded]
// The policy decides once, in the forward; what it decided is recorded as the
// storage itself: an (op, occurrence) with an entry was saved, any other
// occurrence the forward counted was not. The recompute replays that record
// and never asks the policy again, so a policy whose answers depend on state
// that moved in between (a counter shared across invocations, a budget plan
// re-made, the recompute flag) cannot make the two phases disagree. What the
// record cannot explain is an error or a report:
//  - the recompute meets an occurrence the forward never ran (more mm calls
//    than in the forward) in a region that saved outputs, whose keys may now
//    be misaligned: "… is not in storage" (throwNotInStorage). A region that
//    saved nothing (full) just runs it; the checkpoint's determinism check
//    compares what autograd saved;
//  - a saved entry is never asked for by a recompute that completes: the
//    region ran fewer ops in backward; the entry is released and reported
//    with one warning (ReplayStorage::releaseUnserved). A recompute ended by
//    an exception — torch's early stop (torch.utils.checkpoint stops the
//    recompute once every tensor backward needs exists), or an error —
//    releases them silently. Both are counted in InvocationStats::unserved.
Invocation::Admission Invocation::admitRecompute(const c10::OperatorHandle& op) {
  const int64_t occurrence = occurrences_[1][opId(op)]++;
  ++stats_.ops_recompute;
  const auto forward = occurrences_[0].find(opId(op));
  const int64_t forward_count = forward == occurrences_[0].end() ? 0 : forward->second;
  if (C10_UNLIKELY(occurrence >= forward_count)) {
    // With nothing saved there is nothing to misalign: a full checkpoint runs it (and the
    // checkpoint's determinism check compares what autograd saved).
    if (stats_.saved > 0) throwNotInStorage(op, occurrence, id_, forward_count);
    if (C10_UNLIKELY(record_ops_)) logOp(Phase::kRecompute, op, "recomputed");
    ++stats_.recomputed;
    return Admission{Action::kRecompute, occurrence};
  }
  if (ReplayStorage::Entry* saved = storage_.find(OpOccurrence{opId(op), occurrence})) {
    if (C10_UNLIKELY(record_ops_)) logOp(Phase::kRecompute, op, "served");
    return Admission{Action::kServe, occurrence, saved};
  }
  if (!dead_ops_.empty()) {
    if (const DeadOps::Returns* dead = dead_ops_.find(opId(op), occurrence)) {
      if (C10_UNLIKELY(record_ops_)) logOp(Phase::kRecompute, op, "skipped");
      ++stats_.skipped;
      return Admission{Action::kSkip, occurrence, nullptr, dead};
    }
  }
  Admission admission{Action::kRecompute, occurrence};
  admission.verify_routing = routing_.holds(op, occurrence);
  if (C10_UNLIKELY(!state_writes_.empty())) {
    if (const StateWrites::Write* write = state_writes_.find(op, occurrence)) {
      admission = recomputeStateWrite(admission, op, *write);
      if (admission.action == Action::kSkipWrite) return admission;
    }
  }
  if (C10_UNLIKELY(record_ops_)) logOp(Phase::kRecompute, op, "recomputed");
  ++stats_.recomputed;
  return admission;
}

// Note [State written twice]: the rule's answer for an outside write the forward made, as the admission.
Invocation::Admission Invocation::recomputeStateWrite(Admission admission, const c10::OperatorHandle& op,
                                                      const StateWrites::Write& write) {
  ++stats_.state_writes;
  const StateWrites::Replay replay =
      StateWrites::replay(write, op, admission.occurrence, id_, options_.state_writes);
  if (replay == StateWrites::Replay::kRun) return admission;
  ++stats_.state_writes_skipped;
  if (replay == StateWrites::Replay::kSkip) {
    if (C10_UNLIKELY(record_ops_)) logOp(Phase::kRecompute, op, "skipped-write");
    admission.action = Action::kSkipWrite;
  } else {
    admission.redirect_writes = true;
  }
  return admission;
}

// Note [FSDP ranges are ignored]
// FSDP2 runs its lifecycle inside record_function ranges named "FSDP::…"
// (pre_forward, all_gather, all_gather_copy_out, post_backward, reshard).
// Most of its ops are in the ignored table (fsdp::all_gather_copy_in,
// split_with_sizes_copy, the all-gather itself), but not all: a parameter
// sharded on a dim other than 0 is copied out with aten::split.Tensor and
// aten::cat.out, and when its module re-gathers inside a recompute whose
// forward gathered outside the region, those ops run in the recompute only —
// "aten::cat.out occurrence 0 … is not in storage" (the failure of
// NeMo-Automodel #3958 under torch's SAC, reproduced in
// test/python/dist/test_dist_train_field_failures.py). So every op inside an
// FSDP range is ignored, whatever it is: the range's enter op (ignored, as
// every profiler op) names it, nested ranges inside it are counted, and its
// exit ends it. The depth belongs to the phase.
void Invocation::trackRecordFunction(const c10::OperatorHandle& op, const torch::jit::Stack& stack) {
  const auto& name = op.operator_name();
  if (name.name == "profiler::_record_function_exit") {
    if (fsdp_depth_ > 0) --fsdp_depth_;
    return;
  }
  const size_t num_args = op.schema().arguments().size();
  if (num_args == 0 || stack.size() < num_args) return;
  const c10::IValue& range = stack[stack.size() - num_args];
  if (fsdp_depth_ > 0 || (range.isString() && range.toStringRef().rfind("FSDP::", 0) == 0)) ++fsdp_depth_;
}

// Note [Views are recomputed]
// An op whose result aliases its input without writing it — a view (aten::t,
// transpose, split: `Tensor(a) self -> Tensor(a)`) or an unsafe alias
// (_unsafe_view, unsafe_split) — is never saved, whatever the policy
// answered: keeping it holds no bytes of its own, and recomputing it costs
// next to nothing, while serving it would either hand autograd the input
// itself as the view (refused: "View operation returned a tensor that is the
// same as the input base") or cut it from its base, so that a later in-place
// write in the recompute reaches one and not the other. The built-in tables
// save no such op; save lists and budget plans may name them. The test is
// ResolvedOpTables::returnsAlias (policy/op_tables.h), which the traced policy
// of a compiled region applies too.

void Invocation::afterRun(const Admission& admission, const c10::OperatorHandle& op,
                          const torch::jit::Stack& stack) {
  if (storage_.watchesStorages() && tables_.isUnsafeAlias(op)) {
    storage_.watchUnsafeAliases(stack, op.schema().returns().size());  // Note [Unsafe aliases]
  }
  if (C10_UNLIKELY(admission.check_routing)) {
    const int64_t before = routing_.bytes();
    routing_.keep(op, admission.occurrence, stack);
    stats_.routing_kept_bytes += routing_.bytes() - before;
  }
  if (C10_UNLIKELY(admission.remember_skip)) dead_ops_.remember(op, admission.occurrence, stack);
}

bool Invocation::runsInRecompute(const c10::OperatorHandle& op) const {
  if (phase_ != Phase::kRecompute || tables_.isIgnored(op) || fsdp_depth_ > 0) return true;
  const auto next = occurrences_[1].find(opId(op));
  const int64_t occurrence = next == occurrences_[1].end() ? 0 : next->second;
  if (storage_.contains(OpOccurrence{opId(op), occurrence})) return false;
  return dead_ops_.empty() || dead_ops_.find(opId(op), occurrence) == nullptr;
}

bool Invocation::settleLast(const c10::OperatorHandle& op, CheckpointPolicy answer) {
  if (!unsettled_ || unsettled_->op != opId(op)) return false;
  const OpOccurrence key = *unsettled_;
  unsettled_.reset();
  if (!isSave(answer)) {
    discard(key);
    if (C10_UNLIKELY(record_ops_) && !op_log_.empty()) {
      op_log_.back() = "forward " + qualifiedOpName(op.operator_name()) + " run";
    }
    return true;
  }
  // The provisional aliases become the clones keep() makes otherwise.
  if (options_.allow_cache_mutation) storage_.makePrivate(key);
  return true;
}

// The forward's provisional entry for `key`, answered recompute (or never answered): gone as if never kept.
void Invocation::discard(const OpOccurrence& key) {
  if (unsettled_ && *unsettled_ == key) unsettled_.reset();
  const int64_t bytes = storage_.discard(key);
  if (bytes < 0) return;
  --stats_.saved;
  stats_.saved_bytes -= bytes;
}

void Invocation::keep(PendingSave pending, const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  const OpOccurrence key{opId(op), pending.occurrence};
  const int64_t bytes = storage_.keep(std::move(pending), op, stack);
  ++stats_.saved;
  stats_.saved_bytes += bytes;
  if (decides_after_run_) unsettled_ = key;
}

void Invocation::serve(const Admission& admission, const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  TORCH_INTERNAL_ASSERT(admission.entry != nullptr, "hpac: serve() without the entry admit() found");
  storage_.serve(*admission.entry, admission.occurrence, op, stack);
  ++stats_.served;
}

void Invocation::noteAutogradSaved(const at::Tensor& t) {
  if (phase_ != Phase::kForward) return;
  dead_ops_.noteAutogradSaved(t);  // Note [Skips are verified]
  if (profile_.active()) profile_.noteAutogradSaved(*policy_, t);
}

// Note [Frames hold what needs no recompute]
at::Tensor Invocation::holdSaved(const at::Tensor& t) {
  if (phase_ != Phase::kForward || options_.allow_cache_mutation || outer_hooks_ != nullptr) return {};
  if (!t.defined() || !t.has_storage() || t.unsafeGetTensorImpl()->is_python_dispatch()) return {};
  const c10::StorageImpl* storage = t.storage().unsafeGetStorageImpl();
  // Note [The recompute's fixed cost]: the profile learns that this frame holds, and what it holds whatever the plan.
  if (profile_.active()) policy_->observeFrameHolds(state_writes_.produced(storage));
  if (!policy_->holdsEverySaved() && !storage_.holds(storage) && state_writes_.produced(storage)) return {};
  ++stats_.held;
  return detachedAlias(t);
}

void Invocation::releaseKept() {
  TORCH_INTERNAL_ASSERT(phase_ == Phase::kForward, "hpac: releaseKept() after a recompute began");
  storage_.releaseAll();
  kept_released_ = true;
}

void Invocation::verifyRouting(const Admission& admission, const c10::OperatorHandle& op,
                               const torch::jit::Stack& stack) {
  routing_.verify(op, admission.occurrence, id_, stack);
  ++stats_.routing_checked;
}

void Invocation::observeArguments(const c10::OperatorHandle& op, const torch::jit::Stack& stack) {
  if (phase_ != Phase::kForward) return;
  if (profile_.active()) profile_.noteArguments(op, stack);
  if (recorder_ != nullptr) recorder_->noteArguments(op, stack);  // Note [Explain's byte accounting]
}

void Invocation::observe(const Admission& admission, const c10::OperatorHandle& op, const torch::jit::Stack& stack,
                         int64_t nanos) {
  if (profile_.active()) {
    if (admission.action == Action::kRun) profile_.record(*policy_, op, admission.occurrence, stack, nanos);
    if (admission.action == Action::kIgnore) profile_.noteIgnored(op);  // Note [Dead ops are skipped]
  }
  if (recorder_ != nullptr) recordOp(admission, op, stack, nanos);
}

// Explain: the row of one op; the recorder adds its bytes, or the forward's row it replays.
void Invocation::recordOp(const Admission& admission, const c10::OperatorHandle& op, const torch::jit::Stack& stack,
                          int64_t nanos) {
  ExplainedOp row;
  row.phase = phase_;
  row.op = qualifiedOpName(op.operator_name());
  row.occurrence = admission.occurrence;
  row.micros = static_cast<double>(nanos) / 1e3;
  switch (admission.action) {
    case Action::kIgnore:
      row.decision = "ignore";
      row.rule = "ignored-op table (not counted)";
      break;
    case Action::kRun: row.decision = "recompute"; break;
    case Action::kSave: row.decision = "save"; break;
    case Action::kServe: row.decision = "serve"; break;
    case Action::kRecompute: row.decision = "recompute"; break;
    case Action::kSkip: row.decision = "skip"; break;
    case Action::kSkipWrite:
      row.decision = "skip";
      row.rule = "an outside write the forward made: not made again (Note [State written twice])";
      break;
  }
  if (phase_ == Phase::kForward && admission.action != Action::kIgnore) {
    row.answer = toString(last_answer_);
    row.rule = policy_->reason();
    if (row.rule.empty()) row.rule = std::string("policy answered ") + row.answer;
    if (admission.action == Action::kRun && isSave(last_answer_)) {
      row.rule += "; recomputed anyway: its result aliases its input (Note [Views are recomputed])";
    }
  }
  recorder_->record(std::move(row), op, stack);
}

void Invocation::logOp(Phase phase, const c10::OperatorHandle& op, const char* action) {
  op_log_.push_back(std::string(toString(phase)) + " " + qualifiedOpName(op.operator_name()) + " " + action);
}

}  // namespace hpac
