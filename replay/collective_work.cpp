#include "replay/collective_work.h"

#include <torch/csrc/distributed/c10d/Work.hpp>

#include <string>

namespace hpac {

// Note [In-place collectives]
// The dispatcher-routed c10d collectives (c10d::allreduce_, alltoall_,
// allgather_, reduce_scatter_, broadcast_, recv_) write their first argument
// in place and return it together with a Work handle, but their schemas carry
// no alias annotations. hpac treats them like annotated in-place ops: the
// forward waits for the Work (the values are final only then) and snapshots
// the written tensors; the recompute copies the snapshots into its own
// tensors, returns those tensors and the forward's (completed) Work, and never
// re-issues the collective.
bool isInPlaceCollective(const c10::FunctionSchema& schema) {
  const std::string& name = schema.name();
  return name.rfind("c10d::", 0) == 0 && !name.empty() && name.back() == '_';
}

bool isWork(const c10::IValue& value) {
  return value.isCustomClass() && value.type()->str() == "__torch__.torch.classes.c10d.Work";
}

namespace {

// Note [Served Work handles]
// A Work may be waited only once on some backends: Gloo's send and recv wait
// consumes one completion of the underlying buffer, and a second wait blocks
// until the timeout. So whenever hpac waits a saved op's Work itself (the
// in-place collectives, to snapshot their results), the caller is handed a
// Work that is already complete in its place; and what a recompute is served
// is always such a completed Work, never the forward's handle (which the
// forward's caller has waited, or will).
class CompletedWork final : public c10d::Work {
 public:
  CompletedWork() { finish(); }
};

}  // namespace

c10::IValue completedWork() {
  c10::intrusive_ptr<c10d::Work> work = c10::make_intrusive<CompletedWork>();
  return c10::IValue(std::move(work));
}

void waitWorks(torch::jit::Stack* stack, size_t num_returns) {
  for (size_t j = stack->size() - num_returns; j < stack->size(); ++j) {
    if (!isWork((*stack)[j])) continue;
    (*stack)[j].toCustomClass<c10d::Work>()->wait();
    (*stack)[j] = completedWork();
  }
}

}  // namespace hpac
