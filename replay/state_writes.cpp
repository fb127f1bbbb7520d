#include "replay/state_writes.h"

#include "replay/collective_work.h"
#include "replay/dispatch_key.h"
#include "replay/for_each_tensor.h"
#include "replay/torch_compat.h"
#include "replay/written_arguments.h"

#include <c10/core/impl/LocalDispatchKeySet.h>
#include <c10/util/Exception.h>

#include <mutex>
#include <sstream>

namespace hpac {
namespace {

// Whether to warn about `key` now: once per key for the process, every time while torch.set_warn_always(True) (as
// c10's TORCH_WARN_ONCE). The keys are op names and state names (never sizes or invocation numbers), so the set is
// bounded by the model's ops and named tensors, however long the run (Note [Nothing outlives its model]).
bool warnNow(const std::string& key) {
  if (torchWarnsAlways()) return true;
  static std::mutex mutex;
  static auto* warned = new std::unordered_set<std::string>();  // leaked: warnings may come during static destruction
  std::lock_guard<std::mutex> lock(mutex);
  return warned->insert(key).second;
}

bool writes(const c10::Argument& a) { return a.alias_info() != nullptr && a.alias_info()->isWrite(); }

// Batch norm kernels whose schema does not say that, in training (argument 5), they write the running mean and
// variance (arguments 3 and 4).
bool isUnannotatedBatchNorm(const c10::FunctionSchema& schema) {
  const std::string& n = schema.name();
  return n == "aten::native_batch_norm" || n == "aten::cudnn_batch_norm" || n == "aten::miopen_batch_norm";
}

}  // namespace

void StateWrites::name(const std::vector<at::Tensor>& tensors, const std::vector<std::string>& names) {
  for (size_t i = 0; i < tensors.size() && i < names.size(); ++i) {
    const at::Tensor& t = tensors[i];
    if (!t.defined() || !t.has_storage()) continue;
    names_.insert_or_assign(t.storage().unsafeGetStorageImpl(),
                            std::make_pair(c10::weak_intrusive_ptr<c10::StorageImpl>(t.storage().getWeakStorageImpl()),
                                           names[i]));
  }
}

void StateWrites::noteProduced(const c10::FunctionSchema& schema, bool returns_alias, const torch::jit::Stack& stack) {
  if (returns_alias) return;  // a view lives in its base's storage
  const auto& returns = schema.returns();
  const size_t n = returns.size();
  if (stack.size() < n) return;
  for (size_t j = 0; j < n; ++j) {
    if (returns[j].alias_info() != nullptr) continue;  // an in-place / out= result is its argument
    forEachTensor(stack[stack.size() - n + j], [&](const at::Tensor& t) {
      if (t.defined() && t.has_storage()) produced_.insert(t.storage().unsafeGetStorageImpl());
    });
  }
}

bool StateWrites::writesUnannotated(const c10::OperatorHandle& op) { return isUnannotatedBatchNorm(op.schema()); }

bool StateWrites::checkWrite(const c10::OperatorHandle& op, int64_t occurrence, const torch::jit::Stack& stack) {
  const auto& schema = op.schema();
  const auto& args = schema.arguments();
  const size_t begin = stack.size() - args.size();
  const bool collective = isInPlaceCollective(schema);
  const bool batch_norm = isUnannotatedBatchNorm(schema) && args.size() > 5 && stack[begin + 5].isBool() &&
                          stack[begin + 5].toBool();
  Write w;
  bool every_written_outside = true;
  for (size_t i = 0; i < args.size(); ++i) {
    if (!(writes(args[i]) || (collective && i == 0) || (batch_norm && (i == 3 || i == 4)))) continue;
    bool outside = false;
    forEachTensor(stack[begin + i], [&](const at::Tensor& t) {
      if (!t.defined() || !t.has_storage() || produced_.count(t.storage().unsafeGetStorageImpl())) return;
      if (!outside && w.what.empty()) {
        w.name = nameOf(t);
        w.what = describe(t, w.name);
      }
      outside = true;
    });
    if (outside) {
      w.outside_args.push_back(i);
    } else {
      every_written_outside = false;
    }
  }
  if (w.outside_args.empty() || collective) return false;  // a collective's buffer is the region's business
  w.only_writes = every_written_outside;
  for (const auto& ret : schema.returns()) {
    if (ret.alias_info() == nullptr || !ret.alias_info()->isWrite()) w.only_writes = false;
  }
  writes_.insert_or_assign(Key{opId(op), occurrence}, std::move(w));
  return true;
}

std::string StateWrites::nameOf(const at::Tensor& t) const {
  const auto it = names_.find(t.storage().unsafeGetStorageImpl());
  return it != names_.end() && !it->second.first.expired() ? it->second.second : std::string();
}

std::string StateWrites::describe(const at::Tensor& t, const std::string& name) {
  std::ostringstream s;
  if (!name.empty()) {
    s << "'" << name << "' (" << t.sizes() << " " << t.scalar_type() << ")";
  } else {
    s << "a " << t.sizes() << " " << t.scalar_type() << " tensor";
  }
  return s.str();
}

// Note [State written twice]: what the recompute does with an outside write the forward made.
StateWrites::Replay StateWrites::replay(const Write& w, const c10::OperatorHandle& op, int64_t occurrence,
                                        uint64_t invocation, StateWriteRule rule) {
  const std::string what = messageOpName(op.operator_name()) + " occurrence " + std::to_string(occurrence) +
                           " of invocation " + std::to_string(invocation) + " writes " + w.what +
                           " in place, a tensor from outside the checkpoint region (a module buffer, a parameter or an "
                           "input): the forward wrote it, and the recompute in backward writes it again (a counter or "
                           "running statistic counted twice)";
  switch (rule) {
    case StateWriteRule::kError:
      TORCH_CHECK(false, "hpac: ", what, ". Set state_writes: skip (activation_checkpoint.state_writes in the "
                  "trainer's YAML, state_writes=\"skip\" in Python) to make the write once, in the forward "
                  "(Note [State written twice]).");
    case StateWriteRule::kWarn: {
      if (warnNow(qualifiedOpName(op.operator_name()) + " " + (w.name.empty() ? "(unnamed)" : w.name))) {
        TORCH_WARN("hpac: ", what, ". Set state_writes: skip (activation_checkpoint.state_writes in the trainer's "
                   "YAML, state_writes=\"skip\" in Python) to make the write once, or state_writes: error to stop "
                   "(Note [State written twice]). Warned once per op and tensor name (every time under "
                   "torch.set_warn_always(True)).");
      }
      return Replay::kRun;
    }
    case StateWriteRule::kSkip:
      return w.only_writes ? Replay::kSkip : Replay::kRedirect;
  }
  return Replay::kRun;
}

void StateWrites::skipWrite(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  const auto& schema = op.schema();
  const size_t num_args = schema.arguments().size();
  std::vector<c10::IValue> args(std::make_move_iterator(stack->end() - num_args), std::make_move_iterator(stack->end()));
  torch::jit::drop(*stack, num_args);
  for (size_t j = 0; j < schema.returns().size(); ++j) {
    const int64_t aliased = aliasedArgument(schema, j);
    TORCH_INTERNAL_ASSERT(aliased >= 0, "hpac: ", messageOpName(op.operator_name()),
                          " has a return of its own; it cannot be skipped");
    stack->push_back(args[aliased]);
  }
}

void StateWrites::redirectWrites(const c10::OperatorHandle& op, int64_t occurrence, torch::jit::Stack* stack) const {
  const Write* w = find(op, occurrence);
  if (w == nullptr) return;
  const size_t begin = stack->size() - op.schema().arguments().size();
  c10::impl::ExcludeDispatchKeyGuard hide(dispatchKey());
  for (size_t i : w->outside_args) {
    (*stack)[begin + i] = mapTensors((*stack)[begin + i], [](const at::Tensor& t) { return t.defined() ? t.clone() : t; });
  }
}

}  // namespace hpac
