#include "policy/traced_policy.h"

#include <c10/util/Exception.h>

#include <atomic>

namespace hpac {
namespace {
// Traced regions are numbered apart from eager invocations: they never run, and
// their number only names them in a policy's messages.
std::atomic<uint64_t> next_traced_id{1};
}  // namespace

TracedPolicy::TracedPolicy(const PolicyFactory& factory, bool save_routing, bool record_log)
    // No factory is the full checkpoint (policy_kind.h); traced, it is recomputeAllPolicy's PREFER_RECOMPUTE for
    // every op, as torch.compile's own checkpoint without a policy: the partitioner may still keep what is cheaper
    // to keep than to recompute.
    : tables_(ResolvedOpTables::global()),
      policy_(factory ? factory() : recomputeAllPolicy()()),
      id_(next_traced_id.fetch_add(1)),
      save_routing_(save_routing),
      record_log_(record_log) {
  TORCH_CHECK(policy_ != nullptr, "hpac: the policy factory of traced region ", id_, " returned a null policy");
  TORCH_CHECK(!policy_->wantsProfile(),
              "hpac: a memory budget (hpac.budget) cannot decide a region that torch.compile traces: its plan is "
              "made from an eager profile of the region, which compiled code never runs. Use torch.compile's own "
              "budget (torch._functorch.config.activation_memory_budget = 0.5, with the region checkpointed by "
              "torch.utils.checkpoint) or run the region eagerly");
  TORCH_CHECK(!policy_->decidesAfterRun(),
              "hpac: a policy_fn region cannot be decided by hpac's traced policy; under torch.compile "
              "hpac.create_selective_checkpoint_contexts hands the policy_fn to torch's selective checkpoint modes");
  policy_->onPhaseBegin(/*is_recompute=*/false);
}

CheckpointPolicy TracedPolicy::decide(const c10::OperatorHandle& op) {
  if (tables_.isIgnored(op)) {
    ++ignored_;
    if (record_log_) log_.push_back(qualifiedOpName(op.operator_name()) + " ignored");
    return CheckpointPolicy::PREFER_RECOMPUTE;
  }
  const int64_t occurrence = occurrences_[opId(op)]++;
  ++counted_;
  const OpContext ctx{/*is_recompute=*/false, id_, op, occurrence, {}};
  CheckpointPolicy answer = policy_->decide(ctx);
  if (save_routing_ && tables_.isRouting(op)) answer = CheckpointPolicy::MUST_SAVE;
  if (isSave(answer) && tables_.returnsAlias(op)) answer = CheckpointPolicy::MUST_RECOMPUTE;
  saved_ += isSave(answer);
  if (record_log_) log_.push_back(qualifiedOpName(op.operator_name()) + " " + toString(answer));
  return answer;
}

CheckpointPolicy TracedPolicy::decideUnregistered(const std::string& name) {
  if (record_log_) log_.push_back(name + " unregistered");
  return CheckpointPolicy::PREFER_RECOMPUTE;
}

}  // namespace hpac
