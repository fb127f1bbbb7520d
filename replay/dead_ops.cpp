#include "replay/dead_ops.h"

#include "replay/dispatch_key.h"
#include "replay/for_each_tensor.h"

#include <ATen/EmptyTensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_strided.h>
#include <ATen/ops/from_blob.h>
#include <c10/core/ScalarType.h>
#include <c10/core/impl/LocalDispatchKeySet.h>

namespace hpac {

bool readsValues(const ResolvedOpTables& tables, const c10::OperatorHandle& op) {
  return !tables.returnsAlias(op) && op.operator_name().name != "aten::empty_like";
}

bool DeadOps::skippable(const c10::OperatorHandle& op, const torch::jit::Stack& stack) {
  const auto& schema = op.schema();
  if (schema.is_mutable() || op.operator_name().name.rfind("aten::", 0) != 0 ||
      op.hasTag(at::Tag::nondeterministic_seeded)) {
    return false;
  }
  const size_t num_returns = schema.returns().size();
  if (num_returns == 0 || stack.size() < num_returns) return false;
  for (size_t j = 0; j < num_returns; ++j) {
    const auto& ret = schema.returns()[j];
    if (ret.alias_info() != nullptr || ret.type()->kind() != c10::TypeKind::TensorType) return false;
    const c10::IValue& v = stack[stack.size() - num_returns + j];
    if (!v.isTensor()) return false;
    const at::Tensor& t = v.toTensor();
    if (!t.defined() || !t.has_storage() || t.layout() != at::kStrided) return false;
    // Integer and bool results (counts, indices, masks) size and route what follows, and Python reads them back
    // without an op the region sees (tolist(), numpy(), split sizes): never skipped (Note [Dead ops are skipped]).
    if (!c10::isFloatingType(t.scalar_type()) && !c10::isComplexType(t.scalar_type())) return false;
  }
  return true;
}

void DeadOps::remember(const c10::OperatorHandle& op, int64_t occurrence, const torch::jit::Stack& stack) {
  if (!skippable(op, stack)) return;
  const size_t num_returns = op.schema().returns().size();
  Returns r;
  for (size_t j = stack.size() - num_returns; j < stack.size(); ++j) {
    const at::Tensor& t = stack[j].toTensor();
    r.shapes.emplace_back(t.sizes().vec(), t.strides().vec());
    r.options.push_back(t.options());
  }
  skipped_.insert_or_assign(Key{opId(op), occurrence}, std::move(r));
  for (size_t j = stack.size() - num_returns; j < stack.size(); ++j) storages_.of(stack[j].toTensor());
}

// Note [Skips are verified]
// The plan marks ops dead from the profile's dataflow; a later forward may
// flow differently (it diverged from the plan, or the same op sequence wired
// its tensors otherwise). So every forward that skips checks the plan against
// itself: an op the recompute will run (not saved, not skipped, not a view —
// a view reads no values) or an ignored op that reads a storage a skip-marked
// op returned, or a tensor autograd saves that lives in one, voids every skip
// of the invocation when the forward ends; its recompute then runs them all.
// The marked storages are named by StorageIds, whose weak references keep
// each StorageImpl object (not its data) allocated until the forward ends, so
// no later storage can take its address (a freed attention score buffer's
// address taken by the next one voided every skip before).
void DeadOps::checkReads(const torch::jit::Stack& stack, size_t num_args) {
  if (void_) return;
  for (size_t i = stack.size() - num_args; i < stack.size() && !void_; ++i) {
    forEachTensor(stack[i], [&](const at::Tensor& t) {
      if (storages_.find(t) >= 0) void_ = true;
    });
  }
}

void DeadOps::endForward(bool completed) {
  if (void_ || !completed) skipped_.clear();
  storages_.clear();
  void_ = false;
}

// Note [Dead ops are skipped] (policy/budget_plan.h).
// Note [Skipped outputs share one buffer]
// A skipped op's returns are tensors of the forward's sizes and strides whose
// values nothing reads: in a verified forward (Note [Skips are verified]) no
// op the recompute runs reads them, none writes them (an in-place op reads
// its argument), and autograd saves none. So they need no memory of their
// own: every skipped return of one recompute phase lies over one scratch
// buffer per device, grown to the largest one; allocating each (an attention
// score matrix is the layer's largest tensor) would raise the recompute's
// transient peak for nothing.
void DeadOps::skip(const Returns& returns, const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  torch::jit::drop(*stack, op.schema().arguments().size());
  c10::impl::ExcludeDispatchKeyGuard hide(dispatchKey());
  for (size_t j = 0; j < returns.shapes.size(); ++j) {
    const auto& [sizes, strides] = returns.shapes[j];
    const at::TensorOptions& options = returns.options[j];
    const size_t nbytes = at::detail::computeStorageNbytes(sizes, strides, options.dtype().itemsize());
    if (nbytes == 0) {
      stack->emplace_back(at::empty_strided(sizes, strides, options));
      continue;
    }
    at::Tensor* scratch = nullptr;
    for (auto& [device, buffer] : scratch_) {
      if (device == options.device()) scratch = &buffer;
    }
    if (scratch == nullptr) scratch = &scratch_.emplace_back(options.device(), at::Tensor()).second;
    if (!scratch->defined() || static_cast<size_t>(scratch->nbytes()) < nbytes) {
      *scratch = at::empty({static_cast<int64_t>(nbytes)}, options.dtype(at::kByte));  // the old one lives on in its views
    }
    const at::Tensor keep = *scratch;
    if (keep.is_meta()) {  // no data pointer to lay a tensor over (hpac.plan): a view of the scratch's storage
      stack->emplace_back(at::empty({0}, options).set_(keep.storage(), 0, sizes, strides));
      continue;
    }
    stack->emplace_back(at::from_blob(keep.data_ptr(), sizes, strides, [keep](void*) {}, options));
  }
}

}  // namespace hpac
