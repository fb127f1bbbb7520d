#include "replay/op_profile.h"

#include "replay/dead_ops.h"
#include "replay/for_each_tensor.h"
#include "replay/tracking_allocator.h"
#include "replay/written_arguments.h"

#include <c10/core/Device.h>

#include <utility>

namespace hpac {

void OpProfile::begin(bool active) {
  active_ = active;
  ids_.clear();
  last_.reset();
  last_op_.reset();
  pending_reads_.clear();
  // Note [A forward, op by op] (policy/budget_policy.cpp): the live bytes are measured while the tracker counts.
  live_start_ = -1;
  if (active && (TrackingAllocator::installed() || TrackingAllocator::metaTracked())) {
    live_start_ = TrackingAllocator::instance().currentBytes();
    TrackingAllocator::instance().takeOpPeak();
  }
  last_end_ = std::chrono::steady_clock::now();
}

void OpProfile::noteArguments(const c10::OperatorHandle& op, const torch::jit::Stack& stack) {
  // Note [The recompute's fixed cost]: taken first, so the profile's own bookkeeping is not counted.
  pending_gap_micros_ =
      std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - last_end_).count();
  // Note [Dead ops are skipped]: the op's reads; Note [Estimated op costs]: its work.
  const size_t num_args = op.schema().arguments().size();
  pending_work_ = argumentWork(op, stack);
  pending_reads_.clear();
  for (size_t i = stack.size() - num_args; i < stack.size(); ++i) {
    forEachTensor(stack[i], [&](const at::Tensor& t) {
      if (t.defined() && t.has_storage()) pending_reads_.push_back(ids_.of(t));
    });
  }
}

// Note [Profile storage ids]
// A profile names each output's storage so the planner can see which outputs
// share one (Note [Budget as a knapsack]). A StorageImpl address is not a name:
// an output freed during the forward leaves its address to the next
// allocation. While the profile runs, each named StorageImpl is held by a weak
// reference, which keeps the object (not its data) allocated, so no later
// storage can take the address; an expired one still gets a new id.
//
// What keeping this op's outputs would hold, as keep() would hold it: fresh
// storages for the snapshots of written arguments (returned aliased), the
// storages of the other tensor returns.
void OpProfile::record(Policy& policy, const c10::OperatorHandle& op, int64_t occurrence,
                       const torch::jit::Stack& stack, int64_t nanos) {
  const auto& schema = op.schema();
  const size_t num_returns = schema.returns().size();
  ProfiledOp profile;
  const auto& name = op.operator_name();
  profile.op = qualifiedOpName(name);
  profile.id = opId(op);
  profile.occurrence = occurrence;
  profile.micros = static_cast<double>(nanos) / 1e3;
  profile.view = tables_.returnsAlias(op);  // Note [Views are recomputed]
  for (size_t j = 0; j < num_returns; ++j) {
    const c10::IValue& ret = stack[stack.size() - num_returns + j];
    const bool snapshot = aliasedArgument(schema, j) >= 0;
    forEachTensor(ret, [&](const at::Tensor& t) {
      if (!t.defined()) return;
      if (snapshot || !t.has_storage()) {
        profile.storages.emplace_back(ids_.fresh(), static_cast<int64_t>(t.nbytes()));
        return;
      }
      profile.storages.emplace_back(ids_.of(t), static_cast<int64_t>(t.storage().nbytes()));
    });
  }
  // Dataflow (Note [Dead ops are skipped]): what it read, the storages its returns live in.
  profile.reads = std::move(pending_reads_);
  pending_reads_.clear();
  for (size_t j = 0; j < num_returns; ++j) {
    forEachTensor(stack[stack.size() - num_returns + j], [&](const at::Tensor& t) {
      if (t.defined() && t.has_storage()) profile.writes.push_back(ids_.of(t));
    });
  }
  // Note [Estimated op costs]: on the roofline of the device its first tensor return lives on (CPU without one).
  const OpWork work = returnWork(op, stack, pending_work_);
  pending_work_ = OpWork();
  profile.flops = work.flops;
  profile.bytes_moved = work.bytes;
  c10::Device device(c10::kCPU);
  c10::ScalarType dtype = c10::ScalarType::Float;
  bool found = false;
  for (size_t j = stack.size() - num_returns; j < stack.size() && !found; ++j) {
    forEachTensor(stack[j], [&](const at::Tensor& t) {
      if (!found && t.defined()) {
        device = t.device();
        dtype = t.scalar_type();
        found = true;
      }
    });
  }
  // A view runs no kernel: nothing to estimate. The meta device: on the spec set for it (Note [A device that is
  // not here], replay/op_cost.h), in the dtype of its first return.
  if (!profile.view && hasRoofline(device)) {
    profile.estimated_micros = estimatedMicros(work.flops, work.bytes, deviceRoofline(device), dtype);
  }
  profile.skippable = DeadOps::skippable(op, stack);
  profile.collective = name.name.rfind("c10d::", 0) == 0 || name.name.rfind("_c10d_functional::", 0) == 0;
  profile.gap_micros = pending_gap_micros_;
  pending_gap_micros_ = 0;
  // Note [A forward, op by op]: CPU and meta returns only (the tracker counts CPU tensors, and meta ones: Note
  // [Meta tensors are counted]).
  if (live_start_ >= 0) {  // what the step planner reads only with the live bytes
    if (found && (device.is_cpu() || device.is_meta())) profile.live_bytes = TrackingAllocator::instance().takeOpPeak() - live_start_;
    profile.freed = ids_.takeFreed();
  }
  flush(policy);
  last_ = std::make_unique<ProfiledOp>(std::move(profile));
  last_op_ = op;
  last_end_ = std::chrono::steady_clock::now();
}

void OpProfile::noteIgnored(const c10::OperatorHandle& op) {
  if (last_ && readsValues(tables_, op)) {  // Note [Dead ops are skipped]
    last_->later_reads.insert(last_->later_reads.end(), pending_reads_.begin(), pending_reads_.end());
  }
}

void OpProfile::noteAutogradSaved(Policy& policy, const at::Tensor& t) {
  // -1: a storage no op output named (an input, a parameter); the policy still learns that a hook reports.
  policy.observeAutogradSaved(ids_.find(t));
}

void OpProfile::end(Policy& policy) {
  flush(policy);
  ids_.clear();
}

// The profile reaches the policy one op late, so that the reads of ignored ops
// after it can be added (ProfiledOp::later_reads).
void OpProfile::flush(Policy& policy) {
  if (!last_) return;
  const ProfiledOp profile = std::move(*last_);
  const c10::OperatorHandle op = *last_op_;
  last_.reset();
  last_op_.reset();
  policy.observe(OpContext{false, invocation_, op, profile.occurrence, {}}, profile);
}

}  // namespace hpac
