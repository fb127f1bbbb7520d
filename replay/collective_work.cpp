#include "replay/collective_work.h"

#include <ATen/core/dispatch/Dispatcher.h>
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

// Note [Functional collectives are waited before they are saved]
// A functional collective returns its output at once and fills it when the
// matching _c10d_functional::wait_tensor waits its Work; on Gloo the filling
// is a copy_ into the output, which bumps its version counter. Saved at the
// collective and checked at the recompute, that output would look mutated
// after it was saved (found with reduce_scatter_tensor on Gloo). So the
// forward waits a saved functional collective's outputs itself before keeping
// them; the caller's own wait_tensor then finds no pending Work and returns
// the tensor as is. Inside a region the collective is synchronous (on CUDA a
// wait only orders streams).
//
// _c10d_functional::_wrap_tensor_autograd (torch >= 2.10) is no collective: it wraps a collective's output in
// an AsyncCollectiveTensor, a Python subclass that issues its wait_tensor when first used. Waiting that
// wrapper here ran its wait inside hpac's fallback, where the region does not see it, and marked it done, so
// the caller's own wait issued one wait_tensor fewer than when the op was not kept: a budget plan made from a
// profile (nothing kept) then met another op sequence in the next step (measured: every ep2 budget run failed
// in step 2, "its op 72 is _c10d_functional::wait_tensor occurrence 1, the region's is aten::sum"). The
// collective before it is waited when kept; the wrapper is left alone.
bool isFunctionalCollective(const c10::FunctionSchema& schema) {
  const std::string& name = schema.name();
  return name.rfind("_c10d_functional::", 0) == 0 && name != "_c10d_functional::wait_tensor" &&
         name != "_c10d_functional::_wrap_tensor_autograd";
}

void waitFunctionalOutputs(const torch::jit::Stack& stack, size_t num_returns) {
  static const auto wait = c10::Dispatcher::singleton()
                               .findSchemaOrThrow("_c10d_functional::wait_tensor", "")
                               .typed<at::Tensor(const at::Tensor&)>();
  for (size_t j = stack.size() - num_returns; j < stack.size(); ++j) {
    const c10::IValue& v = stack[j];
    if (v.isTensor()) {
      wait.call(v.toTensor());
    } else if (v.isTensorList()) {
      for (const at::Tensor& t : v.toTensorVector()) wait.call(t);
    }
  }
}

}  // namespace hpac
