#include "replay/invocation.h"

#include "replay/collective_work.h"
#include "replay/dead_ops.h"
#include "replay/dispatch_key.h"
#include "replay/explain.h"
#include "replay/for_each_tensor.h"
#include "replay/written_arguments.h"

#include <c10/core/impl/LocalDispatchKeySet.h>
#include <c10/macros/Macros.h>
#include <c10/util/Exception.h>

#include <mutex>
#include <unordered_set>

namespace hpac {
namespace {

std::atomic<uint64_t> next_invocation_id{1};

std::mutex& globalMutex() {
  static std::mutex m;
  return m;
}
InvocationStats& globalTotals() {
  static InvocationStats s;
  return s;
}

int64_t tensorBytes(const at::Tensor& t) {
  return t.defined() ? static_cast<int64_t>(t.nbytes()) : 0;
}

// Applies `fn` to every tensor inside a return value (Tensor, Tensor[], Tensor?[]).
template <typename Fn>
c10::IValue mapTensors(const c10::IValue& v, Fn&& fn) {
  if (v.isTensor()) return fn(v.toTensor());
  if (v.isTensorList()) {
    c10::List<at::Tensor> out;
    for (const at::Tensor& t : v.toTensorList()) out.push_back(fn(t));
    return out;
  }
  if (v.isList()) {
    auto list = v.toList();
    c10::impl::GenericList out(list.elementType());
    for (const c10::IValue& e : list) out.push_back(mapTensors(e, fn));
    return out;
  }
  return v;
}

std::string opName(const c10::OperatorName& name) {
  return messageOpName(name);
}
std::string opName(const c10::OperatorHandle& op) {
  return messageOpName(op.operator_name());
}

// The replay mismatch: the recompute met (op, occurrence) where the forward stored nothing.
[[noreturn]] void throwNotInStorage(const c10::OperatorHandle& op, int64_t occurrence, uint64_t invocation,
                                    int64_t forward_count) {
  TORCH_CHECK(false, "hpac: ", opName(op), " occurrence ", occurrence, " of invocation ", invocation,
              " is not in storage: the forward ran this op ", forward_count,
              " times, and the recompute met an occurrence the forward never ran. "
              "The checkpointed region ran a different op sequence in backward than in forward "
              "(data-dependent control flow, or state that changed between forward and backward). "
              "Make the region deterministic, or keep the varying part outside the checkpoint.");
}

}  // namespace

at::Tensor detachedAlias(const at::Tensor& t) {
  const c10::TensorImpl* impl = t.unsafeGetTensorImpl();
  return at::Tensor(impl->shallow_copy_and_detach(impl->version_counter(), /*allow_tensor_metadata_change=*/true));
}

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
      profile_(tables_, id_),
      recorder_(options_.recorder),
      decides_after_run_(policy_ != nullptr && policy_->decidesAfterRun()),
      respect_outer_hooks_(options_.respect_saved_tensors_hooks),
      dead_ops_(tables_) {
  TORCH_CHECK(policy_ != nullptr, "hpac: the policy factory of invocation ", id_, " returned a null policy");
}

Invocation::~Invocation() = default;

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
  if (phase_ == Phase::kRecompute) {
    releaseUnserved(completed);
    dead_ops_.endRecompute();
    routing_.clear();  // decisions a recompute ended early never compared
  }
  if (profile_.active()) profile_.end(*policy_);
  if (phase_ == Phase::kForward) {  // Note [Skips are verified]
    if (unsettled_) discard(*unsettled_);  // Note [Decided after the op]: nobody answered for the last op
    dead_ops_.endForward(completed);
    state_writes_.endForward();
    if (outer_hooks_ != nullptr && completed) packKept();  // Note [Outer saved-tensor hooks]
    outer_hooks_.reset();
  }
  policy_->onPhaseEnd(phase_ == Phase::kRecompute, completed);
  InvocationStats delta = stats_;
  addScaled(delta, reported_, -1);
  reported_ = stats_;
  std::lock_guard<std::mutex> lock(globalMutex());
  globalTotals() += delta;
}

Invocation::Admission Invocation::admit(Phase phase, const c10::OperatorHandle& op,
                                        const torch::jit::Stack& stack) {
  // Note [Decided after the op]: an op kept provisionally that nobody settled before this one is recomputed.
  if (C10_UNLIKELY(unsettled_.has_value()) && phase == Phase::kForward && !tables_.isIgnored(op)) {
    discard(*unsettled_);
  }
  if (phase == Phase::kForward && !cached_storage_.empty() && op.schema().is_mutable()) {
    copyOnWrite(op.schema(), stack);
  }
  if (tables_.isIgnored(op) || C10_UNLIKELY(fsdp_depth_ > 0)) {
    if (C10_UNLIKELY(tables_.isRecordFunction(op))) trackRecordFunction(op, stack);
    if (C10_UNLIKELY(dead_ops_.watching()) && phase == Phase::kForward) dead_ops_.noteIgnored(op, stack);
    ++stats_.ignored;
    if (C10_UNLIKELY(record_ops_)) logOp(phase, op, "ignored");
    return Admission{Action::kIgnore, -1};
  }
  const bool recompute = phase == Phase::kRecompute;
  const int64_t occurrence = occurrences_[recompute ? 1 : 0][opId(op)]++;
  if (recompute) {
    ++stats_.ops_recompute;
    const auto forward = occurrences_[0].find(opId(op));
    const int64_t forward_count = forward == occurrences_[0].end() ? 0 : forward->second;
    if (C10_UNLIKELY(occurrence >= forward_count)) {
      // With nothing saved there is nothing to misalign: a full checkpoint runs it (and the
      // checkpoint's determinism check compares what autograd saved).
      if (stats_.saved > 0) throwNotInStorage(op, occurrence, id_, forward_count);
      if (C10_UNLIKELY(record_ops_)) logOp(phase, op, "recomputed");
      ++stats_.recomputed;
      return Admission{Action::kRecompute, occurrence};
    }
    const auto saved = storage_.find(Key{opId(op), occurrence});
    if (saved != storage_.end()) {
      if (C10_UNLIKELY(record_ops_)) logOp(phase, op, "served");
      return Admission{Action::kServe, occurrence, &saved->second};
    }
    if (!dead_ops_.empty()) {
      if (const DeadOps::Returns* dead = dead_ops_.find(opId(op), occurrence)) {
        if (C10_UNLIKELY(record_ops_)) logOp(phase, op, "skipped");
        ++stats_.skipped;
        return Admission{Action::kSkip, occurrence, nullptr, dead};
      }
    }
    Admission admission{Action::kRecompute, occurrence};
    admission.verify_routing = routing_.holds(op, occurrence);
    if (C10_UNLIKELY(!state_writes_.empty()) && state_writes_.find(op, occurrence) != nullptr) {
      admission = recomputeStateWrite(admission, op);
      if (admission.action == Action::kSkipWrite) return admission;
    }
    if (C10_UNLIKELY(record_ops_)) logOp(phase, op, "recomputed");
    ++stats_.recomputed;
    return admission;
  }
  // Note [State written twice]
  const bool writes_outside = (op.schema().is_mutable() || StateWrites::writesUnannotated(op)) &&
                              state_writes_.checkWrite(op, occurrence, stack);
  const size_t num_args = op.schema().arguments().size();
  const OpContext ctx{recompute, id_, op, occurrence,
                      c10::ArrayRef<c10::IValue>(stack.data() + stack.size() - num_args, num_args)};
  last_answer_ = policy_->decide(ctx);
  // Note [Views are recomputed]
  bool save_op = isSave(last_answer_) && !tables_.returnsAlias(op) && !writes_outside;
  // Note [Routing is verified]: routing ops are saved (RoutingRule::kSave) or their decision kept for the check.
  const bool routing = tables_.isRouting(op) && !tables_.returnsAlias(op);
  if (routing && options_.routing == RoutingRule::kSave) save_op = true;
  if (C10_UNLIKELY(record_ops_)) logOp(phase, op, save_op ? "saved" : "run");
  ++stats_.ops_forward;
  Admission admission{save_op ? Action::kSave : Action::kRun, occurrence};
  admission.remember_skip = may_skip_ && !save_op && !isSave(last_answer_) && policy_->skipInRecompute();
  admission.check_routing = routing && !save_op && !admission.remember_skip;
  if (C10_UNLIKELY(dead_ops_.watching()) && !save_op && !admission.remember_skip && !tables_.returnsAlias(op)) {
    dead_ops_.checkReads(stack, num_args);  // an op the recompute runs
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
//    with one warning. A recompute ended by an exception — torch's early stop
//    (torch.utils.checkpoint stops the recompute once every tensor backward
//    needs exists), or an error — releases them silently. Both are counted in
//    InvocationStats::unserved.
void Invocation::releaseUnserved(bool completed) {
  int64_t count = 0, bytes = 0;
  std::string names;
  for (auto& [key, entry] : storage_) {
    if (entry.served) continue;
    if (count < 3) {
      names += (count ? ", " : "") + (entry.op_name ? opName(*entry.op_name) : std::string("?")) +
               " occurrence " + std::to_string(key.occurrence);
    }
    ++count;
    bytes += entry.bytes;
    release(entry);
  }
  if (count == 0) return;
  stats_.unserved += count;
  stats_.unserved_bytes += bytes;
  if (completed) {
    TORCH_WARN("hpac: the recompute of invocation ", id_, " completed without asking for ", count,
               " saved output(s) (", bytes, " bytes): ", names, count > 3 ? ", ..." : "",
               ". The region ran fewer ops in backward than in forward; they were released.");
  }
}

void Invocation::observe(const Admission& admission, const c10::OperatorHandle& op, const torch::jit::Stack& stack,
                         int64_t nanos) {
  if (profile_.active()) {
    if (admission.action == Action::kRun) profile_.record(*policy_, op, admission.occurrence, stack, nanos);
    if (admission.action == Action::kIgnore) profile_.noteIgnored(op);  // Note [Dead ops are skipped]
  }
  if (recorder_ != nullptr) recordOp(admission, op, stack, nanos);
}

void Invocation::noteAutogradSaved(const at::Tensor& t) {
  if (phase_ != Phase::kForward) return;
  dead_ops_.noteAutogradSaved(t);  // Note [Skips are verified]
  if (profile_.active()) profile_.noteAutogradSaved(*policy_, t);
}

void Invocation::observeArguments(const c10::OperatorHandle& op, const torch::jit::Stack& stack) {
  if (phase_ != Phase::kForward) return;
  if (profile_.active()) profile_.noteArguments(op, stack);
  if (recorder_ != nullptr) recorder_->noteArguments(op, stack);  // Note [Explain's byte accounting]
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
    case Action::kIgnore: row.decision = "ignore", row.rule = "ignored-op table (not counted)"; break;
    case Action::kRun: row.decision = "recompute"; break;
    case Action::kSave: row.decision = "save"; break;
    case Action::kServe: row.decision = "serve"; break;
    case Action::kRecompute: row.decision = "recompute"; break;
    case Action::kSkip: row.decision = "skip"; break;
    case Action::kSkipWrite:
      row.decision = "skip", row.rule = "an outside write the forward made: not made again (Note [State written twice])";
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

void Invocation::afterRun(const Admission& admission, const c10::OperatorHandle& op,
                          const torch::jit::Stack& stack) {
  if (!cached_storage_.empty() && tables_.isUnsafeAlias(op)) {
    watchUnsafeAliases(stack, op.schema().returns().size());
  }
  if (C10_UNLIKELY(admission.check_routing)) {
    const int64_t before = routing_.bytes();
    routing_.keep(op, admission.occurrence, stack);
    stats_.routing_kept_bytes += routing_.bytes() - before;
  }
  if (C10_UNLIKELY(admission.remember_skip)) dead_ops_.remember(op, admission.occurrence, stack);
}

void Invocation::logOp(Phase phase, const c10::OperatorHandle& op, const char* action) {
  op_log_.push_back(std::string(toString(phase)) + " " + qualifiedOpName(op.operator_name()) + " " + action);
}

// Note [Unsafe aliases]
// A cached output is checked for in-place writes through its version counter,
// which its views share. aten::_unsafe_view and the unsafe_split/chunk ops
// return tensors over the same storage with a version counter of their own:
// `matmul(x, w)` on a non-contiguous 3-D input is mm followed by _unsafe_view,
// and a later `add_` on the result writes into the cached mm output without
// bumping its counter — the recompute would then be served the written values
// (silently wrong gradients). So in the forward, the outputs of these ops that
// share storage with a cached output have their version counters watched too.
void Invocation::watchUnsafeAliases(const torch::jit::Stack& stack, size_t num_returns) {
  for (size_t j = stack.size() - num_returns; j < stack.size(); ++j) {
    forEachTensor(stack[j], [&](const at::Tensor& t) {
      if (!t.defined() || !t.has_storage()) return;
      const auto hit = cached_storage_.find(t.storage().unsafeGetStorageImpl());
      if (hit == cached_storage_.end()) return;
      const c10::VariableVersion& counter = t.unsafeGetTensorImpl()->version_counter();
      storage_.at(hit->second).versions.emplace_back(counter, counter.current_version());
    });
  }
}

// Note [Copy on write]
// A cached output is an alias: it shares storage with the tensor the forward
// goes on using. When a forward op is about to write into that storage (an
// in-place op or out= argument on the output itself, on a view of it, or on an
// unsafe alias such as the _unsafe_view after mm), the entry first takes a
// private copy of what it saved, so the recompute is served the values the op
// produced. Writes hpac cannot see (user code after the region) are caught by
// the version check at serve time instead.
void Invocation::copyOnWrite(const c10::FunctionSchema& schema, const torch::jit::Stack& stack) {
  const std::vector<bool> written = writtenArguments(schema);
  const size_t args_begin = stack.size() - written.size();
  for (size_t i = 0; i < written.size(); ++i) {
    if (!written[i]) continue;
    forEachTensor(stack[args_begin + i], [&](const at::Tensor& t) {
      if (!t.defined() || !t.has_storage()) return;
      const auto hit = cached_storage_.find(t.storage().unsafeGetStorageImpl());
      if (hit == cached_storage_.end()) return;
      makePrivate(storage_.at(hit->second));
    });
  }
}

// The entry's outputs become clones of the aliases it held: nothing outside the region can write to them, so their
// storages and version counters are no longer watched (Note [Copy on write]; settleLast() under cache mutation).
void Invocation::makePrivate(Entry& entry) {
  c10::impl::ExcludeDispatchKeyGuard hide(dispatchKey());
  for (c10::IValue& out : entry.outputs) {
    out = mapTensors(out, [](const at::Tensor& cached) { return cached.defined() ? cached.clone() : cached; });
  }
  for (const c10::StorageImpl* s : entry.storages) cached_storage_.erase(s);
  entry.storages.clear();
  entry.versions.clear();
}

// Forward, SAVE. Arguments the op writes (in-place and out= ops, collectives)
// are remembered before the kernel runs and snapshotted after it, so that the
// recompute's own arguments can be given the same contents.
Invocation::PendingSave Invocation::beginSave(const Admission& admission, const c10::OperatorHandle& op,
                                              const torch::jit::Stack& stack) const {
  const std::vector<bool> written = writtenArguments(op.schema());
  const size_t args_begin = stack.size() - written.size();
  PendingSave pending{admission.occurrence, {}};
  for (size_t i = 0; i < written.size(); ++i) {
    if (written[i]) pending.written_args.push_back(stack[args_begin + i]);
  }
  return pending;
}

void Invocation::keep(PendingSave pending, const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  const auto& schema = op.schema();
  const int64_t occurrence = pending.occurrence;
  const std::vector<c10::IValue>& written_args = pending.written_args;
  const size_t num_returns = schema.returns().size();
  // An asynchronous op's results are final once its Work completes (Note [Served Work handles]).
  if (!written_args.empty()) waitWorks(stack, num_returns);
  Entry entry;
  // Clones (only when mutation is allowed, or for snapshots) must not be seen as region ops.
  c10::impl::ExcludeDispatchKeyGuard hide(dispatchKey());
  if (isFunctionalCollective(schema)) waitFunctionalOutputs(*stack, num_returns);
  for (const c10::IValue& w : written_args) {
    forEachTensor(w, [&](const at::Tensor& t) {
      entry.written.push_back(t.defined() ? t.clone() : t);
      entry.bytes += tensorBytes(t);
    });
  }
  entry.outputs.reserve(num_returns);
  for (size_t j = 0; j < num_returns; ++j) {
    const c10::IValue& ret = (*stack)[stack->size() - num_returns + j];
    if (aliasedArgument(schema, j) >= 0) {
      entry.outputs.emplace_back();  // served as the recompute's own argument
      continue;
    }
    if (isWork(ret)) {
      entry.outputs.push_back(completedWork());
      continue;
    }
    entry.outputs.push_back(mapTensors(ret, [&](const at::Tensor& t) {
      if (!t.defined()) return t;
      entry.bytes += tensorBytes(t);
      if (options_.allow_cache_mutation && !decides_after_run_) return t.clone();  // settleLast() clones
      at::Tensor alias = detachedAlias(t);
      const c10::VariableVersion& counter = alias.unsafeGetTensorImpl()->version_counter();
      entry.versions.emplace_back(counter, counter.current_version());
      if (alias.has_storage()) entry.storages.push_back(alias.storage().unsafeGetStorageImpl());
      return alias;
    }));
  }
  entry.op_name = &op.operator_name();
  ++stats_.saved;
  stats_.saved_bytes += entry.bytes;
  ++stored_entries_;
  stored_bytes_ += entry.bytes;
  for (const c10::StorageImpl* s : entry.storages) cached_storage_[s] = Key{opId(op), occurrence};
  const bool inserted = storage_.emplace(Key{opId(op), occurrence}, std::move(entry)).second;
  TORCH_INTERNAL_ASSERT(inserted, "hpac: duplicate storage key for ", opName(op), " occurrence ", occurrence);
  if (decides_after_run_) unsettled_ = Key{opId(op), occurrence};
}

bool Invocation::settleLast(const c10::OperatorHandle& op, CheckpointPolicy answer) {
  if (!unsettled_ || unsettled_->op != opId(op)) return false;
  const Key key = *unsettled_;
  unsettled_.reset();
  if (!isSave(answer)) {
    discard(key);
    if (C10_UNLIKELY(record_ops_) && !op_log_.empty()) {
      op_log_.back() = "forward " + qualifiedOpName(op.operator_name()) + " run";
    }
    return true;
  }
  // The provisional aliases become the clones keep() makes otherwise.
  if (options_.allow_cache_mutation) makePrivate(storage_.at(key));
  return true;
}

bool Invocation::runsInRecompute(const c10::OperatorHandle& op) const {
  if (phase_ != Phase::kRecompute || tables_.isIgnored(op) || fsdp_depth_ > 0) return true;
  const auto next = occurrences_[1].find(opId(op));
  const int64_t occurrence = next == occurrences_[1].end() ? 0 : next->second;
  if (storage_.count(Key{opId(op), occurrence}) != 0) return false;
  return dead_ops_.empty() || dead_ops_.find(opId(op), occurrence) == nullptr;
}

// The forward's provisional entry for `key`, answered recompute (or never answered): gone as if never kept.
void Invocation::discard(const Key& key) {
  if (unsettled_ && *unsettled_ == key) unsettled_.reset();
  const auto it = storage_.find(key);
  if (it == storage_.end()) return;
  --stats_.saved;
  stats_.saved_bytes -= it->second.bytes;
  release(it->second);
  storage_.erase(it);
}

// Recompute, SAVE: the kernel does not run. Pop the arguments, push fresh
// aliases of what the forward kept, and release the entry.
void Invocation::serve(const Admission& admission, const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  const int64_t occurrence = admission.occurrence;
  TORCH_INTERNAL_ASSERT(admission.entry != nullptr, "hpac: serve() without the entry admit() found");
  Entry& entry = *admission.entry;
  TORCH_CHECK(!entry.served, "hpac: ", opName(op), " occurrence ", occurrence, " of invocation ", id_,
              " was already served: backward ran through this selective checkpoint region an extra time. "
              "Saved outputs are released as they are served; for a second backward use full "
              "checkpointing (no policy) for this region or run the forward again.");
  if (!options_.allow_cache_mutation) {
    for (const auto& [counter, version] : entry.versions) {
      const uint32_t now = counter.current_version();
      if (C10_LIKELY(now == version)) continue;
      const uint32_t at_save = version;
      release(entry);  // reported by this error, not again as unserved (ends `version`'s lifetime)
      TORCH_CHECK(false, "hpac: the cached output of ", opName(op), " occurrence ", occurrence, " of invocation ", id_,
                  " was modified in place after it was saved (version ", at_save, " at save, ", now,
                  " now): it was mutated after the region, so serving it would give wrong gradients (writes inside "
                  "the region are copied on write). Don't write to it before backward, or set "
                  "allow_cache_entry_mutation=True (saved outputs are then cloned when saved).");
    }
  }
  if (!entry.packed.empty()) unpack(entry);  // Note [Outer saved-tensor hooks]
  const auto& schema = op.schema();
  const size_t num_args = schema.arguments().size();
  const size_t args_begin = stack->size() - num_args;
  std::vector<c10::IValue> args(std::make_move_iterator(stack->begin() + args_begin),
                                std::make_move_iterator(stack->end()));
  stack->erase(stack->begin() + args_begin, stack->end());
  {
    c10::impl::ExcludeDispatchKeyGuard hide(dispatchKey());
    size_t w = 0;
    const std::vector<bool> written = writtenArguments(schema);
    for (size_t i = 0; i < num_args; ++i) {
      if (!written[i]) continue;
      forEachTensor(args[i], [&](const at::Tensor& t) {
        TORCH_CHECK(w < entry.written.size(), "hpac: ", opName(op), " occurrence ", occurrence,
                    " of invocation ", id_, " writes more tensors in recompute than in forward");
        if (t.defined()) const_cast<at::Tensor&>(t).copy_(entry.written[w]);
        ++w;
      });
    }
  }
  for (size_t j = 0; j < entry.outputs.size(); ++j) {
    const int64_t aliased = aliasedArgument(schema, j);
    if (aliased >= 0) {
      stack->push_back(args[aliased]);
    } else {
      stack->push_back(mapTensors(entry.outputs[j],
                                  [](const at::Tensor& t) { return t.defined() ? detachedAlias(t) : t; }));
    }
  }
  ++stats_.served;
  release(entry);
}

// Note [Outer saved-tensor hooks]
void Invocation::packKept() {
  c10::impl::ExcludeDispatchKeyGuard hide(dispatchKey());  // the hooks' own ops are not the region's
  for (auto& [key, entry] : storage_) {
    if (entry.served || !entry.packed.empty()) continue;
    bool gave_none = false;
    auto pack = [&](const at::Tensor& t) -> at::Tensor {
      entry.defined.push_back(t.defined());
      if (!t.defined()) return t;
      std::unique_ptr<torch::autograd::SavedVariableHooks> hooks = outer_hooks_->make();
      if (hooks == nullptr) {
        gave_none = true;
        return t;
      }
      hooks->call_pack_hook(t);
      entry.packed.push_back(std::move(hooks));
      ++stats_.packed;
      return at::Tensor();
    };
    for (c10::IValue& out : entry.outputs) out = mapTensors(out, pack);
    for (at::Tensor& w : entry.written) w = pack(w);
    TORCH_INTERNAL_ASSERT(!gave_none || entry.packed.empty(), "hpac: the outer saved-tensor hooks vanished while "
                          "invocation ", id_, " packed its kept outputs");
    if (gave_none) {
      entry.defined.clear();
      return;
    }
    for (const c10::StorageImpl* s : entry.storages) cached_storage_.erase(s);
    entry.storages.clear();
  }
}

void Invocation::unpack(Entry& entry) {
  c10::impl::ExcludeDispatchKeyGuard hide(dispatchKey());
  size_t slot = 0, next = 0;
  auto unpacked = [&](const at::Tensor&) -> at::Tensor {
    TORCH_INTERNAL_ASSERT(slot < entry.defined.size(), "hpac: packed entry of invocation ", id_, " is short");
    if (!entry.defined[slot++]) return at::Tensor();
    return entry.packed[next++]->call_unpack_hook();
  };
  for (c10::IValue& out : entry.outputs) out = mapTensors(out, unpacked);
  for (at::Tensor& w : entry.written) w = unpacked(w);
  entry.packed.clear();
  entry.defined.clear();
}

// Note [State written twice]: what the recompute does with an outside write the forward made.
Invocation::Admission Invocation::recomputeStateWrite(Admission admission, const c10::OperatorHandle& op) {
  const StateWrites::Write& w = *state_writes_.find(op, admission.occurrence);
  ++stats_.state_writes;
  const std::string what = opName(op) + " occurrence " + std::to_string(admission.occurrence) + " of invocation " +
                           std::to_string(id_) + " writes " + w.what +
                           " in place, a tensor from outside the checkpoint region (a module buffer, a parameter or an "
                           "input): the forward wrote it, and the recompute in backward writes it again (a counter or "
                           "running statistic counted twice)";
  switch (options_.state_writes) {
    case StateWriteRule::kError:
      TORCH_CHECK(false, "hpac: ", what, ". Set state_writes: skip (activation_checkpoint.state_writes in the "
                  "trainer's YAML, state_writes=\"skip\" in Python) to make the write once, in the forward "
                  "(Note [State written twice]).");
    case StateWriteRule::kWarn: {
      static std::mutex warned_mutex;
      static std::unordered_set<std::string>* warned = new std::unordered_set<std::string>();
      std::lock_guard<std::mutex> lock(warned_mutex);
      if (warned->insert(qualifiedOpName(op.operator_name()) + " " + w.what).second) {
        TORCH_WARN("hpac: ", what, ". Set state_writes: skip (activation_checkpoint.state_writes in the trainer's "
                   "YAML, state_writes=\"skip\" in Python) to make the write once, or state_writes: error to stop "
                   "(Note [State written twice]). Warned once per op and tensor.");
      }
      return admission;
    }
    case StateWriteRule::kSkip:
      ++stats_.state_writes_skipped;
      if (w.only_writes) {
        if (C10_UNLIKELY(record_ops_)) logOp(Phase::kRecompute, op, "skipped-write");
        admission.action = Action::kSkipWrite;
      } else {
        admission.redirect_writes = true;
      }
      return admission;
  }
  return admission;
}

void Invocation::skipWrite(const Admission& /*admission*/, const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  const auto& schema = op.schema();
  const size_t num_args = schema.arguments().size();
  std::vector<c10::IValue> args(std::make_move_iterator(stack->end() - num_args), std::make_move_iterator(stack->end()));
  torch::jit::drop(*stack, num_args);
  for (size_t j = 0; j < schema.returns().size(); ++j) {
    const int64_t aliased = aliasedArgument(schema, j);
    TORCH_INTERNAL_ASSERT(aliased >= 0, "hpac: ", opName(op), " has a return of its own; it cannot be skipped");
    stack->push_back(args[aliased]);
  }
}

void Invocation::redirectWrites(const Admission& admission, const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  const StateWrites::Write* w = state_writes_.find(op, admission.occurrence);
  if (w == nullptr) return;
  const size_t begin = stack->size() - op.schema().arguments().size();
  c10::impl::ExcludeDispatchKeyGuard hide(dispatchKey());
  for (size_t i : w->outside_args) {
    (*stack)[begin + i] = mapTensors((*stack)[begin + i], [](const at::Tensor& t) { return t.defined() ? t.clone() : t; });
  }
}

void Invocation::verifyRouting(const Admission& admission, const c10::OperatorHandle& op,
                               const torch::jit::Stack& stack) {
  routing_.verify(op, admission.occurrence, id_, stack);
  ++stats_.routing_checked;
}

void Invocation::noteProduced(const Admission& admission, const c10::OperatorHandle& op,
                              const torch::jit::Stack& stack) {
  if (admission.action == Action::kSkip || admission.action == Action::kServe) return;
  state_writes_.noteProduced(op.schema(), tables_.returnsAlias(op), stack);
}

// Note [Frames hold what needs no recompute]
at::Tensor Invocation::holdSaved(const at::Tensor& t) {
  if (phase_ != Phase::kForward || options_.allow_cache_mutation || outer_hooks_ != nullptr) return {};
  if (profile_.active()) policy_->observeFrameHolds();  // Note [The recompute's fixed cost]
  if (!t.defined() || !t.has_storage() || t.unsafeGetTensorImpl()->is_python_dispatch()) return {};
  const c10::StorageImpl* storage = t.storage().unsafeGetStorageImpl();
  if (!policy_->holdsEverySaved() && cached_storage_.count(storage) == 0 && state_writes_.produced(storage)) return {};
  ++stats_.held;
  return detachedAlias(t);
}

void Invocation::releaseKept() {
  TORCH_INTERNAL_ASSERT(phase_ == Phase::kForward, "hpac: releaseKept() after a recompute began");
  for (auto& [key, entry] : storage_) {
    if (!entry.served) release(entry);
  }
  kept_released_ = true;
}

// Drops what an entry holds; the key stays, marked served, so that asking for it again is
// "already served" (an extra backward), not "not in storage".
void Invocation::release(Entry& entry) {
  --stored_entries_;
  stored_bytes_ -= entry.bytes;
  for (const c10::StorageImpl* s : entry.storages) cached_storage_.erase(s);
  entry = Entry{};
  entry.served = true;
}

}  // namespace hpac
